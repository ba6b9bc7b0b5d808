//! The f64 oracle of the GPT block: the forward with materialized attention and its
//! hand-derived backward (checked by central differences in the tests), one sequence at a
//! time. Cost O(s^2 h + 24 s h^2) per sequence, memory O(s^2) per head. `causal_rows`: the
//! exact outputs of some tokens of a causal sequence alone, the keys and values of every
//! token before them as blocked f64 GEMMs (ndarray): O(2 s h^2 + r (2 s h + 12 h^2)) for r
//! tokens, memory O(s h).

use std::ops::Range;

use ndarray::{s, Array2, ArrayView2, Axis};
use rayon::prelude::*;

use super::params::{Param, View};

/// C (`m x n`) = A (`m x k`) B (`k x n`), with A or B read transposed when flagged
/// (`at`: A is stored `k x m`; `bt`: B is stored `n x k`).
fn mm(a: &[f64], b: &[f64], (m, k, n): (usize, usize, usize), at: bool, bt: bool) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    c.par_chunks_mut(n.max(1)).enumerate().for_each(|(i, row)| {
        for p in 0..k {
            let aip = if at { a[p * m + i] } else { a[i * k + p] };
            if aip == 0.0 {
                continue;
            }
            if bt {
                for (j, r) in row.iter_mut().enumerate() {
                    *r += aip * b[j * k + p];
                }
            } else {
                let brow = &b[p * n..(p + 1) * n];
                for (r, bv) in row.iter_mut().zip(brow) {
                    *r += aip * bv;
                }
            }
        }
    });
    c
}

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn gelu(z: f64) -> f64 {
    let t = (0.797_884_560_802_865_4 * (z + 0.044_715 * z * z * z)).tanh();
    0.5 * z * (1.0 + t)
}

fn gelu_grad(z: f64) -> f64 {
    let c = 0.797_884_560_802_865_4;
    let t = (c * (z + 0.044_715 * z * z * z)).tanh();
    0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044_715 * z * z)
}

/// Row-wise layer norm: (output, xhat, 1/std).
fn layer_norm(x: &[f64], g: &[f64], b: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let h = g.len();
    let rows = x.len() / h;
    let (mut out, mut xhat, mut rstd) = (vec![0.0; x.len()], vec![0.0; x.len()], vec![0.0; rows]);
    for r in 0..rows {
        let xr = &x[r * h..(r + 1) * h];
        let mean = xr.iter().sum::<f64>() / h as f64;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h as f64;
        rstd[r] = 1.0 / (var + super::ops::LN_EPS as f64).sqrt();
        for j in 0..h {
            xhat[r * h + j] = (xr[j] - mean) * rstd[r];
            out[r * h + j] = xhat[r * h + j] * g[j] + b[j];
        }
    }
    (out, xhat, rstd)
}

/// dx of a layer norm for upstream `dy`; adds the gain and bias gradients.
fn layer_norm_backward(
    dy: &[f64],
    xhat: &[f64],
    rstd: &[f64],
    g: &[f64],
    dg: &mut [f64],
    db: &mut [f64],
) -> Vec<f64> {
    let h = g.len();
    let mut dx = vec![0.0; dy.len()];
    for (r, &rs) in rstd.iter().enumerate() {
        let (mut mg, mut mgx) = (0.0, 0.0);
        for j in 0..h {
            let t = dy[r * h + j] * g[j];
            mg += t;
            mgx += t * xhat[r * h + j];
            dg[j] += dy[r * h + j] * xhat[r * h + j];
            db[j] += dy[r * h + j];
        }
        mg /= h as f64;
        mgx /= h as f64;
        for j in 0..h {
            dx[r * h + j] = rs * (dy[r * h + j] * g[j] - mg - xhat[r * h + j] * mgx);
        }
    }
    dx
}

fn add_rows(m: &mut [f64], bias: &[f64]) {
    for row in m.chunks_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
    }
}

fn column_sums(m: &[f64], n: usize) -> Vec<f64> {
    let mut s = vec![0.0; n];
    for row in m.chunks(n) {
        s.iter_mut().zip(row).for_each(|(a, b)| *a += b);
    }
    s
}

/// The exact layer on one sequence of `s` tokens (`x`: `s x h`).
pub struct Exact {
    pub out: Vec<f64>,
    /// With an upstream gradient: dx (`s x h`) and the flat parameter gradient.
    pub dx: Vec<f64>,
    pub dp: Vec<f64>,
}

/// Forward (and, with `d_out`, backward) of one sequence in f64.
pub fn sequence(
    heads: usize,
    causal: bool,
    params: &[f32],
    x: &[f32],
    d_out: Option<&[f32]>,
) -> Exact {
    let h = params_h(params);
    let p = View::new(h, params);
    let get = |q: Param| f64s(p.get(q));
    let s = x.len() / h;
    let (a, d) = (heads, h / heads);
    let scale = 1.0 / (d as f64).sqrt();
    let x = f64s(x);
    let (g1, b1ln) = (get(Param::Ln1Gain), get(Param::Ln1Bias));
    let (u, xhat1, rstd1) = layer_norm(&x, &g1, &b1ln);
    let wqkv = get(Param::Wqkv);
    let mut qkv = mm(&u, &wqkv, (s, h, 3 * h), false, false);
    add_rows(&mut qkv, &get(Param::Bqkv));
    // Per head: P (s x s) and O into att (s x h).
    let mut probs = vec![vec![0.0; s * s]; a];
    let mut att = vec![0.0; s * h];
    for (hd, pm) in probs.iter_mut().enumerate() {
        pm.par_chunks_mut(s).enumerate().for_each(|(i, prow)| {
            let vis = if causal { i + 1 } else { s };
            let qi = &qkv[i * 3 * h + hd * d..][..d];
            let mut mx = f64::NEG_INFINITY;
            for (j, pj) in prow.iter_mut().enumerate().take(vis) {
                let kj = &qkv[j * 3 * h + h + hd * d..][..d];
                *pj = scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>();
                mx = mx.max(*pj);
            }
            let mut sum = 0.0;
            for pj in prow.iter_mut().take(vis) {
                *pj = (*pj - mx).exp();
                sum += *pj;
            }
            prow.iter_mut().take(vis).for_each(|pj| *pj /= sum);
        });
        for i in 0..s {
            for j in 0..s {
                let pij = pm[i * s + j];
                if pij != 0.0 {
                    let vj = &qkv[j * 3 * h + 2 * h + hd * d..][..d];
                    for (o, v) in att[i * h + hd * d..][..d].iter_mut().zip(vj) {
                        *o += pij * v;
                    }
                }
            }
        }
    }
    let tl = tail(&p, &att, &x);
    let Some(d_out) = d_out else {
        return Exact {
            out: tl.out,
            dx: Vec::new(),
            dp: Vec::new(),
        };
    };
    let mut dp = vec![0.0; params.len()];
    let mut put = |q: Param, v: &[f64]| {
        dp[q.range(h)].iter_mut().zip(v).for_each(|(a, b)| *a += b);
    };
    let (datt, dy) = tail_backward(&p, &tl, &att, &f64s(d_out), &mut put);
    let mut dqkv = vec![0.0; s * 3 * h];
    for (hd, pm) in probs.iter().enumerate() {
        for i in 0..s {
            let dai = &datt[i * h + hd * d..][..d];
            // dP_ij = dO_i . V_j; dS = P (dP - sum_j P dP).
            let dpr: Vec<f64> = (0..s)
                .map(|j| {
                    let vj = &qkv[j * 3 * h + 2 * h + hd * d..][..d];
                    dai.iter().zip(vj).map(|(a, b)| a * b).sum()
                })
                .collect();
            let dot: f64 = (0..s).map(|j| pm[i * s + j] * dpr[j]).sum();
            for j in 0..s {
                let pij = pm[i * s + j];
                if pij == 0.0 {
                    continue;
                }
                let ds = pij * (dpr[j] - dot) * scale;
                for t in 0..d {
                    let qit = qkv[i * 3 * h + hd * d + t];
                    let kjt = qkv[j * 3 * h + h + hd * d + t];
                    dqkv[i * 3 * h + hd * d + t] += ds * kjt;
                    dqkv[j * 3 * h + h + hd * d + t] += ds * qit;
                    dqkv[j * 3 * h + 2 * h + hd * d + t] += pij * dai[t];
                }
            }
        }
    }
    put(Param::Wqkv, &mm(&u, &dqkv, (h, s, 3 * h), true, false));
    put(Param::Bqkv, &column_sums(&dqkv, 3 * h));
    let du = mm(&dqkv, &wqkv, (s, 3 * h, h), false, true);
    let (mut dg1, mut db1) = (vec![0.0; h], vec![0.0; h]);
    let mut dx = layer_norm_backward(&du, &xhat1, &rstd1, &g1, &mut dg1, &mut db1);
    put(Param::Ln1Gain, &dg1);
    put(Param::Ln1Bias, &db1);
    dx.iter_mut().zip(&dy).for_each(|(a, b)| *a += b);
    Exact {
        out: tl.out,
        dx,
        dp,
    }
}

/// Tokens a chunk of the key/value projection (one GEMM each, in parallel).
const KV_CHUNK: usize = 1024;

/// LN1 then the Q, K, V projection of some tokens of one sequence, as `sequence` computes
/// them, with ndarray GEMMs: what the row oracles below need of the attention's inputs.
struct Projection<'a> {
    x: &'a [f32],
    h: usize,
    g1: Vec<f64>,
    b1: Vec<f64>,
    /// `h x 3h`.
    wqkv: Array2<f64>,
    bqkv: Vec<f64>,
}

impl<'a> Projection<'a> {
    fn new(p: &View, x: &'a [f32]) -> Self {
        let h = p.h;
        let get = |q: Param| f64s(p.get(q));
        let wqkv = get(Param::Wqkv);
        Projection {
            x,
            h,
            g1: get(Param::Ln1Gain),
            b1: get(Param::Ln1Bias),
            wqkv: Array2::from_shape_fn((h, 3 * h), |(i, j)| wqkv[i * 3 * h + j]),
            bqkv: get(Param::Bqkv),
        }
    }

    /// LN1 of tokens `t`: (output, xhat, 1/std), as `layer_norm` gives them.
    fn ln1(&self, t: &Range<usize>) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let h = self.h;
        layer_norm(&f64s(&self.x[t.start * h..t.end * h]), &self.g1, &self.b1)
    }

    /// Columns `cols` of [Q | K | V] (`t.len() x cols.len()`) of tokens `t`.
    fn rows(&self, t: Range<usize>, cols: Range<usize>) -> Array2<f64> {
        let (n, h) = (t.len(), self.h);
        let (u, _, _) = self.ln1(&t);
        let u = Array2::from_shape_fn((n, h), |(i, j)| u[i * h + j]);
        let mut r = u.dot(&self.wqkv.slice(s![.., cols.clone()]));
        for mut row in r.rows_mut() {
            row.iter_mut()
                .zip(&self.bqkv[cols.clone()])
                .for_each(|(v, b)| *v += b);
        }
        r
    }

    /// [K | V] (`m x 2h`) of tokens `0..m`, in parallel chunks.
    fn keys_values(&self, m: usize) -> Array2<f64> {
        let h = self.h;
        let mut kv = Array2::<f64>::zeros((m, 2 * h));
        let chunks: Vec<_> = kv.axis_chunks_iter_mut(Axis(0), KV_CHUNK).collect();
        chunks.into_par_iter().enumerate().for_each(|(c, mut dst)| {
            let t0 = c * KV_CHUNK;
            let rows = self.rows(t0..t0 + dst.nrows(), h..3 * h);
            dst.assign(&rows);
        });
        kv
    }
}

/// P (`q.nrows() x k.nrows()`) of one head for the query tokens `first..` of a causal
/// sequence: softmax(scale · q kᵀ) with keys after each query masked to 0.
fn causal_probs(q: ArrayView2<f64>, k: ArrayView2<f64>, first: usize, scale: f64) -> Array2<f64> {
    let mut pm = q.dot(&k.t());
    for (bi, mut prow) in pm.rows_mut().into_iter().enumerate() {
        let vis = first + bi + 1;
        let mx = prow
            .iter()
            .take(vis)
            .fold(f64::NEG_INFINITY, |m, &s| m.max(scale * s));
        let mut sum = 0.0;
        for (j, sc) in prow.iter_mut().enumerate() {
            *sc = if j < vis {
                (scale * *sc - mx).exp()
            } else {
                0.0
            };
            sum += *sc;
        }
        prow.mapv_inplace(|v| v / sum);
    }
    pm
}

/// The exact outputs (`r x h`, the tokens of `ranges` in order) of the tokens `ranges`
/// (sorted, disjoint) of one CAUSAL sequence `x` (`s x h`): as `sequence` computes them, but
/// only the keys and values of tokens before the last range's end, and only these tokens'
/// attention rows (per head S = Q_blk K^T, causal mask, softmax, P V) and FFN.
pub fn causal_rows(heads: usize, params: &[f32], x: &[f32], ranges: &[Range<usize>]) -> Vec<f64> {
    let h = params_h(params);
    let p = View::new(h, params);
    let d = h / heads;
    let scale = 1.0 / (d as f64).sqrt();
    let proj = Projection::new(&p, x);
    let kv = proj.keys_values(ranges.last().map_or(0, |r| r.end));
    let att_parts: Vec<Array2<f64>> = ranges
        .par_iter()
        .map(|rg| {
            let q = proj.rows(rg.clone(), 0..h);
            let mut att = Array2::<f64>::zeros((rg.len(), h));
            for hd in 0..heads {
                let cols = hd * d..(hd + 1) * d;
                let k = kv.slice(s![..rg.end, cols.clone()]);
                let v = kv.slice(s![..rg.end, h + hd * d..h + (hd + 1) * d]);
                let pm = causal_probs(q.slice(s![.., cols.clone()]), k, rg.start, scale);
                att.slice_mut(s![.., cols]).assign(&pm.dot(&v));
            }
            att
        })
        .collect();
    let att: Vec<f64> = att_parts.iter().flat_map(|a| a.iter().copied()).collect();
    let xr: Vec<f64> = ranges
        .iter()
        .flat_map(|r| f64s(&x[r.start * h..r.end * h]))
        .collect();
    tail(&p, &att, &xr).out
}

/// dx (`r x h`) of the last `r` tokens of one CAUSAL sequence `x` (`s x h`), for the upstream
/// gradient `d_out` (`r x h`) of those tokens. Exact: no earlier token's output depends on
/// them, so their gradient needs no other token's upstream gradient. The forward of their
/// rows as `causal_rows` computes it (P kept, `r x s` per head), `tail_backward`, then the
/// attention backward of their queries (dQ against every key, dK and dV of their own keys)
/// and LN1's. O(2 s h^2 + 4 r s h + 24 r h^2), memory O(s h + r s).
pub fn causal_last_rows_dx(heads: usize, params: &[f32], x: &[f32], d_out: &[f32]) -> Vec<f64> {
    let h = params_h(params);
    let p = View::new(h, params);
    let d = h / heads;
    let scale = 1.0 / (d as f64).sqrt();
    let (n, r) = (x.len() / h, d_out.len() / h);
    let last = n - r..n;
    let proj = Projection::new(&p, x);
    let kv = proj.keys_values(n);
    let q = proj.rows(last.clone(), 0..h);
    let probs: Vec<Array2<f64>> = (0..heads)
        .into_par_iter()
        .map(|hd| {
            let k = kv.slice(s![.., hd * d..(hd + 1) * d]);
            causal_probs(q.slice(s![.., hd * d..(hd + 1) * d]), k, last.start, scale)
        })
        .collect();
    let mut att = Array2::<f64>::zeros((r, h));
    for (hd, pm) in probs.iter().enumerate() {
        let v = kv.slice(s![.., h + hd * d..h + (hd + 1) * d]);
        att.slice_mut(s![.., hd * d..(hd + 1) * d])
            .assign(&pm.dot(&v));
    }
    let att: Vec<f64> = att.iter().copied().collect();
    let tl = tail(&p, &att, &f64s(&x[last.start * h..]));
    let (datt, dy) = tail_backward(&p, &tl, &att, &f64s(d_out), &mut |_, _| {});
    let datt = Array2::from_shape_vec((r, h), datt).expect("r x h");
    // dP = dO Vᵀ, dS = P (dP - rowsum(P dP)) scale; dQ = dS K, and the block's own keys and
    // values: dK = dSᵀ Q, dV = Pᵀ dO over its columns.
    let mut dqkv = Array2::<f64>::zeros((r, 3 * h));
    for (hd, pm) in probs.iter().enumerate() {
        let cols = hd * d..(hd + 1) * d;
        let k = kv.slice(s![.., cols.clone()]);
        let v = kv.slice(s![.., h + hd * d..h + (hd + 1) * d]);
        let dai = datt.slice(s![.., cols.clone()]);
        let mut ds = dai.dot(&v.t());
        for (mut drow, prow) in ds.rows_mut().into_iter().zip(pm.rows()) {
            let dot: f64 = drow.iter().zip(prow.iter()).map(|(a, b)| a * b).sum();
            drow.iter_mut()
                .zip(prow.iter())
                .for_each(|(g, p)| *g = p * (*g - dot) * scale);
        }
        let own = s![.., last.clone()];
        dqkv.slice_mut(s![.., cols.clone()]).assign(&ds.dot(&k));
        dqkv.slice_mut(s![.., h + hd * d..h + (hd + 1) * d])
            .assign(&ds.slice(own).t().dot(&q.slice(s![.., cols])));
        dqkv.slice_mut(s![.., 2 * h + hd * d..2 * h + (hd + 1) * d])
            .assign(&pm.slice(own).t().dot(&dai));
    }
    let du: Vec<f64> = dqkv.dot(&proj.wqkv.t()).iter().copied().collect();
    let (_, xhat1, rstd1) = proj.ln1(&last);
    let (mut dg, mut db) = (vec![0.0; h], vec![0.0; h]);
    let mut dx = layer_norm_backward(&du, &xhat1, &rstd1, &proj.g1, &mut dg, &mut db);
    dx.iter_mut().zip(&dy).for_each(|(a, b)| *a += b);
    dx
}

/// The block after attention, row by row, and what its backward keeps.
struct Tail {
    /// LN2(y) for y = att Wo + bo + x, with its normalized input and reciprocal deviations.
    vn: Vec<f64>,
    xhat2: Vec<f64>,
    rstd2: Vec<f64>,
    /// The FFN's pre-activation and its GELU.
    z: Vec<f64>,
    g: Vec<f64>,
    /// out = GELU(z) W2 + b2 + y.
    out: Vec<f64>,
}

/// `Tail` of rows `att` (attention outputs) and `x` (the block's inputs), `h` wide each:
/// the output projection and residual, LN2, the FFN and its residual.
fn tail(p: &View, att: &[f64], x: &[f64]) -> Tail {
    let h = p.h;
    let get = |q: Param| f64s(p.get(q));
    let r = x.len() / h;
    let mut y = mm(att, &get(Param::Wo), (r, h, h), false, false);
    add_rows(&mut y, &get(Param::Bo));
    y.iter_mut().zip(x).for_each(|(y, x)| *y += x);
    let (vn, xhat2, rstd2) = layer_norm(&y, &get(Param::Ln2Gain), &get(Param::Ln2Bias));
    let mut z = mm(&vn, &get(Param::W1), (r, h, 4 * h), false, false);
    add_rows(&mut z, &get(Param::B1));
    let g: Vec<f64> = z.iter().map(|&v| gelu(v)).collect();
    let mut out = mm(&g, &get(Param::W2), (r, 4 * h, h), false, false);
    add_rows(&mut out, &get(Param::B2));
    out.iter_mut().zip(&y).for_each(|(o, y)| *o += y);
    Tail {
        vn,
        xhat2,
        rstd2,
        z,
        g,
        out,
    }
}

/// The backward of `tail` for rows `att` (its input) and upstream `dout`: (d att, dy), dy
/// being the gradient at y = att Wo + bo + x (the residual's, so also x's share); the
/// parameter gradients of the rows go to `put`.
fn tail_backward(
    p: &View,
    t: &Tail,
    att: &[f64],
    dout: &[f64],
    put: &mut impl FnMut(Param, &[f64]),
) -> (Vec<f64>, Vec<f64>) {
    let h = p.h;
    let get = |q: Param| f64s(p.get(q));
    let r = dout.len() / h;
    put(Param::W2, &mm(&t.g, dout, (4 * h, r, h), true, false));
    put(Param::B2, &column_sums(dout, h));
    let mut dz = mm(dout, &get(Param::W2), (r, h, 4 * h), false, true);
    dz.iter_mut()
        .zip(&t.z)
        .for_each(|(d, z)| *d *= gelu_grad(*z));
    put(Param::W1, &mm(&t.vn, &dz, (h, r, 4 * h), true, false));
    put(Param::B1, &column_sums(&dz, 4 * h));
    let dvn = mm(&dz, &get(Param::W1), (r, 4 * h, h), false, true);
    let (mut dg2, mut db2) = (vec![0.0; h], vec![0.0; h]);
    let g2 = get(Param::Ln2Gain);
    let mut dy = layer_norm_backward(&dvn, &t.xhat2, &t.rstd2, &g2, &mut dg2, &mut db2);
    put(Param::Ln2Gain, &dg2);
    put(Param::Ln2Bias, &db2);
    dy.iter_mut().zip(dout).for_each(|(a, b)| *a += b);
    put(Param::Wo, &mm(att, &dy, (h, r, h), true, false));
    put(Param::Bo, &column_sums(&dy, h));
    let datt = mm(&dy, &get(Param::Wo), (r, h, h), false, true);
    (datt, dy)
}

/// The hidden size of a flat parameter vector (12h^2 + 13h values).
fn params_h(params: &[f32]) -> usize {
    let n = params.len() as f64;
    let h = ((-13.0 + (169.0 + 48.0 * n).sqrt()) / 24.0).round() as usize;
    assert_eq!(
        super::params::count(h),
        params.len(),
        "not a layer's parameters"
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::params;

    /// A patterned input x and upstream gradient dout of `n` values each, within ±1.6, of
    /// periods 23 and 17 (they do not line up): varied yet the same on every run, no RNG.
    fn patterned(n: usize) -> (Vec<f32>, Vec<f32>) {
        let x = (0..n)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let dout = (0..n).map(|i| ((i * 13 % 17) as f32 - 8.0) / 5.0).collect();
        (x, dout)
    }

    fn loss(heads: usize, causal: bool, p: &[f32], x: &[f32], dout: &[f32]) -> f64 {
        let e = sequence(heads, causal, p, x, None);
        e.out.iter().zip(dout).map(|(o, g)| o * *g as f64).sum()
    }

    /// The hand-derived backward equals central differences of the forward, for the
    /// input and entries of every parameter tensor.
    #[test]
    fn gradients_match_central_differences() {
        let (h, heads, s) = (8, 2, 5);
        let p = params::generate(h, 3);
        let (x, dout) = patterned(s * h);
        for causal in [true, false] {
            let ex = sequence(heads, causal, &p, &x, Some(&dout));
            let eps = 1e-3f32;
            let fd = |f: &dyn Fn(f32) -> f64| (f(eps) - f(-eps)) / (2.0 * eps as f64);
            for i in [0, 7, 13, 39] {
                let g = fd(&|e| {
                    let mut xx = x.clone();
                    xx[i] += e;
                    loss(heads, causal, &p, &xx, &dout)
                });
                assert!(
                    (ex.dx[i] - g).abs() < 2e-3 * (1.0 + g.abs()),
                    "dx[{i}]: {} vs {g}",
                    ex.dx[i]
                );
            }
            for q in params::Param::ALL {
                let r = q.range(h);
                for i in [r.start, r.start + r.len() / 2, r.end - 1] {
                    let g = fd(&|e| {
                        let mut pp = p.clone();
                        pp[i] += e;
                        loss(heads, causal, &pp, &x, &dout)
                    });
                    assert!(
                        (ex.dp[i] - g).abs() < 2e-3 * (1.0 + g.abs()),
                        "{} [{i}]: {} vs {g}",
                        q.name(),
                        ex.dp[i]
                    );
                }
            }
        }
    }

    /// `causal_rows` equals `sequence`'s rows (1e-12 of the largest |value|) for
    /// ranges at the start, the middle and the end, and a single token.
    #[test]
    fn causal_rows_equal_the_full_sequence() {
        let (h, heads, s) = (16, 4, 150);
        let p = params::generate(h, 5);
        let (x, _) = patterned(s * h);
        let full = sequence(heads, true, &p, &x, None).out;
        let big = full.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let lists: [Vec<Range<usize>>; 4] = [
            vec![0..10, 70..80, 140..150],
            std::iter::once(0..1).collect(),
            std::iter::once(149..150).collect(),
            std::iter::once(0..150).collect(),
        ];
        for ranges in lists {
            let got = causal_rows(heads, &p, &x, &ranges);
            let tokens: Vec<usize> = ranges.iter().flat_map(|r| r.clone()).collect();
            assert_eq!(got.len(), tokens.len() * h);
            for (t, row) in tokens.iter().zip(got.chunks(h)) {
                for (a, b) in row.iter().zip(&full[t * h..(t + 1) * h]) {
                    assert!((a - b).abs() <= 1e-12 * big, "token {t}: {a} vs {b}");
                }
            }
        }
    }

    /// `causal_last_rows_dx` equals `sequence`'s dx of the last tokens (1e-12 of the largest
    /// |dx|) with the upstream gradient of every token given to `sequence` and only the last
    /// tokens' to it: their gradient depends on no earlier token's.
    #[test]
    fn last_rows_dx_equal_the_full_backward() {
        let (h, heads, s) = (16, 4, 150);
        let p = params::generate(h, 5);
        let (x, dout) = patterned(s * h);
        let full = sequence(heads, true, &p, &x, Some(&dout)).dx;
        let big = full.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for r in [1, 7, 64, 150] {
            let got = causal_last_rows_dx(heads, &p, &x, &dout[(s - r) * h..]);
            assert_eq!(got.len(), r * h);
            for (i, (a, b)) in got.iter().zip(&full[(s - r) * h..]).enumerate() {
                assert!((a - b).abs() <= 1e-12 * big, "r {r}, value {i}: {a} vs {b}");
            }
        }
    }

    /// Wall time of `causal_rows` on `spread_rows` at the largest BPT context
    /// (configs/bpt_max_context.toml: 65536 tokens, hidden 256). Run with `--ignored --nocapture`.
    #[test]
    #[ignore]
    fn time_causal_rows_at_benchmark_size() {
        let (h, heads, s) = (256, 4, 65536);
        let p = params::generate(h, 5);
        let (x, _) = patterned(s * h);
        let ranges = crate::layer::spread_rows(s);
        assert_eq!(ranges, vec![0..64, 32736..32800, 65472..65536]);
        let t = std::time::Instant::now();
        let out = causal_rows(heads, &p, &x, &ranges);
        println!(
            "causal_rows, 192 tokens of 65536, h 256: {:.2} s",
            t.elapsed().as_secs_f64()
        );
        assert!(out.iter().all(|v| v.is_finite()));
        let t = std::time::Instant::now();
        let dx = causal_last_rows_dx(heads, &p, &x, &x[(s - 64) * h..]);
        println!(
            "causal_last_rows_dx, the last 64 tokens of 65536, h 256: {:.2} s",
            t.elapsed().as_secs_f64()
        );
        assert!(dx.iter().all(|v| v.is_finite()));
    }
}
