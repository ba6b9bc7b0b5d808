//! The resolved grid: `[axes]` (defaults filled, pow2 expanded) and the `[[zip]]` groups,
//! and the checks that make them a well-formed grid (required axes, no axis twice, zip
//! lists of equal length).

use serde::Serialize;
use std::collections::BTreeMap;

use super::axis::{parse_axis, Axis, AxisDefault, AxisValue};
use super::schema::RawAxes;
use super::source::{Section, Source};
use crate::error::Result;

/// The independent axes, each with its non-empty list of values. An axis absent here is
/// either in a zip group or derived per case (see `Axis` defaults: kv_heads = heads,
/// seq_kv = seq_len, chunks = the variant's default, window = none).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Axes {
    values: BTreeMap<Axis, Vec<AxisValue>>,
}

impl Axes {
    pub fn get(&self, axis: Axis) -> Option<&[AxisValue]> {
        self.values.get(&axis).map(Vec::as_slice)
    }

    /// In expansion order.
    pub fn iter(&self) -> impl Iterator<Item = (Axis, &[AxisValue])> {
        self.values.iter().map(|(a, v)| (*a, v.as_slice()))
    }
}

/// Axes that vary together: the i-th values of every member form one grid point.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(transparent)]
pub struct ZipGroup {
    values: BTreeMap<Axis, Vec<AxisValue>>,
}

impl ZipGroup {
    pub fn get(&self, axis: Axis) -> Option<&[AxisValue]> {
        self.values.get(&axis).map(Vec::as_slice)
    }

    pub fn members(&self) -> impl Iterator<Item = Axis> + '_ {
        self.values.keys().copied()
    }

    /// Number of points (every member's list has this length).
    pub fn len(&self) -> usize {
        self.values.values().next().map_or(0, Vec::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The group's points, each assigning one value to every member.
    pub fn points(&self) -> Vec<Vec<(Axis, AxisValue)>> {
        (0..self.len())
            .map(|i| self.values.iter().map(|(a, v)| (*a, v[i])).collect())
            .collect()
    }
}

/// The values of the `threads` axis within `run::max_threads` (other axes pass).
fn check_threads(
    axis: Axis,
    values: Vec<AxisValue>,
) -> std::result::Result<Vec<AxisValue>, String> {
    if axis == Axis::Threads {
        for v in &values {
            if let AxisValue::Size(n) = v {
                if let Some(why) = super::run::threads_refused(*n) {
                    return Err(why);
                }
            }
        }
    }
    Ok(values)
}

/// Check and resolve `[axes]` and the zip groups; `run` gives the defaults of `threads` and
/// `kernel_path`.
pub(super) fn resolve_axes(
    axes: Option<RawAxes>,
    zips: Vec<RawAxes>,
    run: &super::RunConfig,
    src: &Source,
) -> Result<(Axes, Vec<ZipGroup>)> {
    let mut owner: BTreeMap<Axis, Section> = BTreeMap::new();
    let mut resolved = Axes::default();
    for (axis, value) in axes.unwrap_or_default().into_entries() {
        let values = parse_axis(axis, &value)
            .and_then(|v| check_threads(axis, v))
            .map_err(|m| src.err(Section::Axes, axis.name(), m))?;
        owner.insert(axis, Section::Axes);
        resolved.values.insert(axis, values);
    }

    let mut groups = Vec::new();
    for (i, raw) in zips.into_iter().enumerate() {
        let section = Section::Zip(i);
        let mut values = BTreeMap::new();
        for (axis, value) in raw.into_entries() {
            if let Some(prev) = owner.get(&axis) {
                let prev = match prev {
                    Section::Axes => "[axes]".to_string(),
                    other => other.to_string(),
                };
                return Err(src.err(
                    section,
                    axis.name(),
                    format!("axis also set in {prev}; an axis belongs to [axes] or to one [[zip]] group"),
                ));
            }
            let v = parse_axis(axis, &value)
                .and_then(|v| check_threads(axis, v))
                .map_err(|m| src.err(section, axis.name(), m))?;
            owner.insert(axis, section);
            values.insert(axis, v);
        }
        let group = ZipGroup { values };
        if group.values.values().any(|v| v.len() != group.len()) {
            let lens: Vec<String> = group
                .values
                .iter()
                .map(|(a, v)| format!("{a}: {}", v.len()))
                .collect();
            return Err(src.section_err(
                section,
                format!(
                    "zipped lists must have equal lengths, got {}",
                    lens.join(", ")
                ),
            ));
        }
        // An empty group (possible after `--set` moved its last member out) adds nothing.
        if !group.is_empty() {
            groups.push(group);
        }
    }

    // Decode generates one new token unless told otherwise: seq_len (the query length) is
    // then optional.
    let modes: Vec<AxisValue> = resolved
        .get(Axis::Mode)
        .map(<[AxisValue]>::to_vec)
        .or_else(|| {
            groups
                .iter()
                .find_map(|g| g.get(Axis::Mode).map(<[AxisValue]>::to_vec))
        })
        .unwrap_or_default();
    if let Some(&section) = owner.get(&Axis::BatchSpec) {
        let clash: Vec<&str> = [Axis::Batch, Axis::SeqLen, Axis::SeqKv]
            .into_iter()
            .filter(|a| owner.contains_key(a))
            .map(|a| a.name())
            .collect();
        if !clash.is_empty() {
            return Err(src.err(
                section,
                Axis::BatchSpec.name(),
                format!(
                    "batch_spec gives every sequence's lengths: drop {} (or drop batch_spec)",
                    clash.join(", ")
                ),
            ));
        }
    }
    check_mla(&owner, &resolved, &groups, src)?;
    let all_decode = !modes.is_empty()
        && modes
            .iter()
            .all(|m| *m == AxisValue::Mode(crate::problem::Mode::Decode));
    for axis in Axis::ALL {
        if owner.contains_key(&axis) {
            continue;
        }
        // A batch_spec gives every sequence's lengths: seq_len is not needed beside it.
        if axis == Axis::SeqLen && (all_decode || owner.contains_key(&Axis::BatchSpec)) {
            resolved.values.insert(axis, vec![AxisValue::Size(1)]);
            continue;
        }
        match axis.default(run) {
            AxisDefault::Required => {
                return Err(src.err(
                    Section::Axes,
                    axis.name(),
                    "required (in [axes] or in a [[zip]] group; seq_len defaults to 1 new token only when every mode is decode)",
                ))
            }
            AxisDefault::Fixed(v) => {
                resolved.values.insert(axis, vec![v]);
            }
            AxisDefault::Derived(_) => {}
        }
    }
    Ok((resolved, groups))
}

/// `latent_dim` and `rope_dim` come together, where some variant of the grid reads an MLA
/// cache (mla-decode), which needs them: otherwise the key named is an error (exit 2).
fn check_mla(
    owner: &BTreeMap<Axis, Section>,
    resolved: &Axes,
    groups: &[ZipGroup],
    src: &Source,
) -> Result<()> {
    use crate::variant::Registry;
    let variants = resolved
        .get(Axis::Variant)
        .into_iter()
        .chain(groups.iter().filter_map(|g| g.get(Axis::Variant)))
        .flatten();
    let mut readers = Vec::new();
    for v in variants {
        if let AxisValue::Variant(id) = v {
            if id.get().reads_mla() && !readers.contains(&id.name()) {
                readers.push(id.name());
            }
        }
    }
    let (latent, rope) = (owner.get(&Axis::LatentDim), owner.get(&Axis::RopeDim));
    for (axis, section, other) in [
        (Axis::LatentDim, latent, Axis::RopeDim),
        (Axis::RopeDim, rope, Axis::LatentDim),
    ] {
        let Some(&section) = section else { continue };
        if readers.is_empty() {
            return Err(src.err(
                section,
                axis.name(),
                "no variant of the grid reads an MLA cache (latent_dim and rope_dim apply to mla-decode only)",
            ));
        }
        if !owner.contains_key(&other) {
            return Err(src.err(
                section,
                axis.name(),
                format!(
                    "needs {} beside it (the MLA cache has both parts)",
                    other.name()
                ),
            ));
        }
    }
    if let (Some(first), None) = (readers.first(), latent) {
        return Err(src.err(
            Section::Axes,
            Axis::LatentDim.name(),
            format!("required by {first} (with rope_dim: its MLA cache's dimensions)"),
        ));
    }
    Ok(())
}
