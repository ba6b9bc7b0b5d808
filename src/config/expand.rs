//! Axis expansion: the cartesian product of the independent axes and the zip groups (each
//! group one axis, placed at its innermost member), normalized into `Case`s and deduplicated.

use crate::variant::impossible::{impossible, LeftOut};
use crate::variant::Registry;
use std::collections::HashSet;

use super::axis::{self, Axis, AxisDefault, AxisValue};
use super::grid::{Axes, ZipGroup};
use crate::problem::{Case, Device, Shape, VariantId};

/// One factor of the product: its points, each assigning values to one or more axes.
type Dim = Vec<Vec<(Axis, AxisValue)>>;

/// The axes in expansion order, outermost first: the fixed order of `Axis::ALL`, except that
/// `innermost` (`run.innermost`) come last, in their order, so they turn fastest.
pub(super) fn expansion_order(innermost: &[Axis]) -> Vec<Axis> {
    Axis::ALL
        .into_iter()
        .filter(|a| !innermost.contains(a))
        .chain(innermost.iter().copied())
        .collect()
}

/// The member of a zip group deepest in `order`: the group takes its position.
fn deepest(g: &ZipGroup, order: &[Axis]) -> Option<Axis> {
    g.members()
        .max_by_key(|m| order.iter().position(|a| a == m))
}

/// The factors in expansion order (outermost first).
fn dims(axes: &Axes, zip: &[ZipGroup], order: &[Axis]) -> Vec<Dim> {
    let mut dims = Vec::new();
    for &a in order {
        if let Some(values) = axes.get(a) {
            dims.push(values.iter().map(|v| vec![(a, *v)]).collect());
        }
        for g in zip.iter().filter(|g| deepest(g, order) == Some(a)) {
            dims.push(g.points());
        }
    }
    dims
}

/// What a grid expands to: its cases, and the combinations no variant has
/// (`variant::impossible`), left out and counted per variant.
#[derive(Clone, Debug, Default)]
pub struct Expansion {
    /// In expansion order, without duplicates (first kept).
    pub cases: Vec<Case>,
    /// One entry per variant with left-out combinations, in first-seen order; each distinct
    /// combination (case id) counted once.
    pub left_out: Vec<LeftOut>,
}

impl Expansion {
    /// How many combinations were left out in all.
    pub fn left_out_count(&self) -> usize {
        self.left_out.iter().map(|l| l.count).sum()
    }
}

/// Every case of the grid, in expansion order, without duplicates (first kept); the
/// combinations their variant does not have are left out and counted.
pub(super) fn expand(
    axes: &Axes,
    zip: &[ZipGroup],
    seed: u64,
    threads: usize,
    innermost: &[Axis],
) -> Expansion {
    let dims = dims(axes, zip, &expansion_order(innermost));
    let mut out = Expansion::default();
    if dims.iter().any(Vec::is_empty) {
        return out;
    }
    let mut seen = HashSet::new();
    let mut idx = vec![0; dims.len()];
    loop {
        let point = dims
            .iter()
            .zip(&idx)
            .flat_map(|(d, &i)| d[i].iter().copied());
        if let Some(case) = build(point, seed, threads) {
            if seen.insert(case.id()) {
                match impossible(&case) {
                    None => out.cases.push(case),
                    Some(why) => {
                        let name = case.variant_name();
                        let i = match out.left_out.iter().position(|l| l.variant == name) {
                            Some(i) => i,
                            None => {
                                out.left_out.push(LeftOut::of(&case));
                                out.left_out.len() - 1
                            }
                        };
                        out.left_out[i].add(why);
                    }
                }
            }
        }
        // Odometer: the last factor turns fastest.
        let mut k = dims.len();
        loop {
            if k == 0 {
                return out;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < dims[k].len() {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// One case from one grid point; None if a required axis is missing (validation prevents it).
fn build(
    point: impl Iterator<Item = (Axis, AxisValue)>,
    seed: u64,
    threads: usize,
) -> Option<Case> {
    let (mut variant, mut seq_q) = (None, None);
    let (mut mode, mut device, mut dtype) = (
        axis::DEFAULT_MODE,
        axis::DEFAULT_DEVICE,
        axis::DEFAULT_DTYPE,
    );
    let (mut input_dist, mut input_scale, mut causal, mut threads) = (
        axis::DEFAULT_INPUT_DIST,
        axis::DEFAULT_INPUT_SCALE,
        false,
        threads,
    );
    let (mut batch, mut heads, mut head_dim) = (
        axis::DEFAULT_BATCH,
        axis::DEFAULT_HEADS,
        axis::DEFAULT_HEAD_DIM,
    );
    let mut d_out = axis::DEFAULT_D_OUT;
    let (mut kv_heads, mut seq_kv, mut q_chunk, mut kv_chunk, mut window) =
        (None, None, None, None, None);
    let (mut devices, mut splits, mut allreduce) = (axis::DEFAULT_DEVICES, None, None);
    let (mut external, mut page_size, mut page_order) = (None, None, None);
    let (mut prefill_chunk, mut batch_spec, mut kernel_path) = (None, None, None);
    let (mut prefix_len, mut sinks) = (None, None);
    let mut kv_dtype = None;
    let mut precision = None;
    let (mut latent_dim, mut rope_dim) = (None, None);
    for (a, v) in point {
        match (a, v) {
            (Axis::Variant, AxisValue::Variant(x)) => variant = Some(x),
            (Axis::Variant, AxisValue::External(x)) => {
                variant = Some(VariantId::External);
                external = Some(x.to_string());
            }
            (Axis::Mode, AxisValue::Mode(x)) => mode = x,
            (Axis::Device, AxisValue::Device(x)) => device = x,
            (Axis::DType, AxisValue::DType(x)) => dtype = x,
            (Axis::KvDtype, AxisValue::Fp8(x)) => kv_dtype = x.0,
            (Axis::InputDist, AxisValue::InputDist(x)) => input_dist = x,
            (Axis::InputScale, AxisValue::Scale(x)) => input_scale = x,
            (Axis::DOut, AxisValue::DOut(x)) => d_out = x,
            (Axis::Causal, AxisValue::Bool(x)) => causal = x,
            (Axis::Threads, AxisValue::Size(x)) => threads = x,
            (Axis::KernelPath, AxisValue::KernelPath(x)) => kernel_path = Some(x),
            (Axis::Precision, AxisValue::Precision(x)) => precision = Some(x),
            (Axis::Batch, AxisValue::Size(x)) => batch = x,
            (Axis::Heads, AxisValue::Size(x)) => heads = x,
            (Axis::KvHeads, AxisValue::Size(x)) => kv_heads = Some(x),
            (Axis::HeadDim, AxisValue::Size(x)) => head_dim = x,
            (Axis::QChunk, AxisValue::Size(x)) => q_chunk = Some(x),
            (Axis::KvChunk, AxisValue::Size(x)) => kv_chunk = Some(x),
            (Axis::Window, AxisValue::OptSize(x)) => window = x,
            (Axis::PrefixLen, AxisValue::OptSize(x)) => prefix_len = x,
            (Axis::Sinks, AxisValue::OptSize(x)) => sinks = x,
            (Axis::Devices, AxisValue::Size(x)) => devices = x,
            (Axis::Splits, AxisValue::Size(x)) => splits = Some(x),
            (Axis::PageSize, AxisValue::Size(x)) => page_size = Some(x),
            (Axis::PageOrder, AxisValue::PageOrder(x)) => page_order = Some(x),
            (Axis::PrefillChunk, AxisValue::Size(x)) => prefill_chunk = Some(x),
            (Axis::BatchSpec, AxisValue::BatchSpec(x)) => batch_spec = Some(x),
            (Axis::LatentDim, AxisValue::Size(x)) => latent_dim = Some(x),
            (Axis::RopeDim, AxisValue::Size(x)) => rope_dim = Some(x),
            (Axis::Allreduce, AxisValue::Allreduce(x)) => allreduce = Some(x),
            (Axis::SeqKv, AxisValue::Size(x)) => seq_kv = Some(x),
            (Axis::SeqLen, AxisValue::Size(x)) => seq_q = Some(x),
            _ => {}
        }
    }
    let (variant, mut seq_q) = (variant?, seq_q?);
    let mut seq_kv = seq_kv.unwrap_or(seq_q);
    // A variant of ragged batches runs the batch_spec; one of packed batches only runs a
    // batch of equal lengths written as one. Packed: one row of sequences, the totals as
    // lengths.
    let v = variant.get();
    let batch_spec = match batch_spec {
        Some(spec) => Some(spec.clone()),
        None => v
            .packed_only()
            .then(|| crate::problem::BatchSpec::uniform(batch, seq_q, seq_kv)),
    };
    if let Some(spec) = &batch_spec {
        (batch, seq_q, seq_kv) = (1, spec.total_q(), spec.total_kv());
    }
    let info = variant.info();
    let shape = Shape {
        batch,
        heads,
        kv_heads: kv_heads.unwrap_or(heads),
        seq_q,
        seq_kv,
        head_dim,
    };
    // Axes a variant does not read are dropped, so such cases differ in nothing else.
    // A variant that does not cut a loop has no chunk there, whatever the axis says; the
    // others use the axis or their default, as `min(chunk, n)` in the paper.
    let chunk = |default: Option<usize>, given: Option<usize>, n: usize| {
        default.map(|d| given.unwrap_or(d).min(n))
    };
    let (mut q_chunk, mut kv_chunk) = (
        chunk(info.default_q_chunk, q_chunk, seq_q),
        chunk(info.default_kv_chunk, kv_chunk, seq_kv),
    );
    // A GPU kernel may fix the chunks (flash's tiles; the record shows them).
    if let Some(fixed) = variant.fixed_chunks(device, dtype, seq_q, seq_kv) {
        (q_chunk, kv_chunk) = fixed;
    }
    let default_splits = match batch_spec {
        Some(_) if device == Device::Cpu => v.default_splits_ragged(&shape, threads),
        _ => variant.default_splits(device, &shape, threads),
    };
    Some(Case {
        variant,
        mode,
        device,
        dtype,
        shape,
        q_chunk,
        kv_chunk,
        causal,
        window,
        devices,
        splits: default_splits.map(|d| splits.unwrap_or(d)),
        allreduce: v.default_allreduce().map(|d| allreduce.unwrap_or(d)),
        threads,
        input_dist,
        input_scale,
        seed,
        d_out,
        external,
        paging: v.default_paging().map(|d| crate::problem::Paging {
            page_size: page_size.unwrap_or(d.page_size),
            order: page_order.unwrap_or(d.order),
        }),
        // A default chunk is clamped to the prompt; a chunk the config names is kept (one
        // longer than the prompt is a skipped row that says so).
        prefill_chunk: v
            .default_prefill_chunk()
            .map(|d| prefill_chunk.unwrap_or(d.min(seq_q))),
        batch_spec,
        // Only attnbench's own CPU kernels have paths; elsewhere the key would only split
        // one measurement into identical rows.
        kernel_path: kernel_path
            .filter(|_| device == Device::Cpu && variant != VariantId::External),
        prefix_len,
        kv_dtype,
        // Only a variant of an MLA cache reads these (config validation requires both
        // where one is in the grid); the others drop them, as any axis they do not read.
        mla: match (v.reads_mla(), latent_dim, rope_dim) {
            (true, Some(latent_dim), Some(rope_dim)) => Some(crate::problem::Mla {
                latent_dim,
                rope_dim,
            }),
            _ => None,
        },
        sinks,
        precision,
    })
}

/// (axis, values as shown) in expansion order; a zip group is one row named `zip(a, b)`
/// whose values are the tuples; derived axes show their rule.
pub(super) fn grid_summary(
    axes: &Axes,
    zip: &[ZipGroup],
    run: &super::RunConfig,
) -> Vec<(String, String)> {
    let join = |v: &[AxisValue]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut rows = Vec::new();
    let order = expansion_order(&run.innermost);
    for &a in &order {
        if let Some(values) = axes.get(a) {
            rows.push((a.name().to_string(), join(values)));
        } else if let (false, AxisDefault::Derived(rule)) =
            (zip.iter().any(|g| g.get(a).is_some()), a.default(run))
        {
            rows.push((a.name().to_string(), rule.to_string()));
        }
        for g in zip.iter().filter(|g| deepest(g, &order) == Some(a)) {
            let names: Vec<&str> = g.members().map(Axis::name).collect();
            let tuples: Vec<String> = g
                .points()
                .iter()
                .map(|p| format!("({})", join(&p.iter().map(|(_, v)| *v).collect::<Vec<_>>())))
                .collect();
            rows.push((format!("zip({})", names.join(", ")), tuples.join(", ")));
        }
    }
    rows
}
