//! The GPT block's forward and its checkpointed forward + backward, block by block as a
//! `Plan` says (Liu & Abbeel Algorithm 1 for BPT; one whole-sequence block for vanilla and
//! memory-efficient). Attention runs on the registry's `naive` or `flash` kernels (their
//! backward passes included); everything else is row-wise and GEMMs. Cost: forward
//! 24*b*s*h^2 + attention FLOPs; a training step recomputes the forward before its backward.

use std::mem::take;

use super::ops::{
    add_bias, add_column_sums, copy_plus_bias, gelu_backward_in_place, gelu_in_place, gelu_into,
    gemm, layer_norm, layer_norm_backward, layer_norm_param_grads,
};
use super::params::{Param, View};
use super::plan::{self, Block, Dims, Plan};
use super::store::{self, try_tensor};
use crate::algorithm::Saved;
use crate::backend::cpu::gemm::MatRef;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::workspace::try_zeroed;
use crate::error::{Error, Result};
use crate::problem::{Grads, Inputs, Shape, Tensor};

/// The layer's buffers, allocated once per call in `Plan::buffers` order.
/// K, V, Q and the per-head copies are in the storage dtype; everything else is f32.
struct Bufs {
    k: Tensor,
    v: Tensor,
    u: Vec<f32>,
    st1: Vec<f32>,
    qb: Tensor,
    ob: Vec<f32>,
    y: Vec<f32>,
    vn: Vec<f32>,
    st2: Vec<f32>,
    z: Vec<f32>,
    g: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    dz: Vec<f32>,
    dvn: Vec<f32>,
    dy: Vec<f32>,
    dob: Vec<f32>,
    dqb: Vec<f32>,
    du: Vec<f32>,
    /// One head's projection of a block (f32), before it is rounded into its store.
    proj: Vec<f32>,
    q_h: Tensor,
    o_h: Vec<f32>,
    k_h: Tensor,
    v_h: Tensor,
    do_h: Vec<f32>,
    dq_h: Vec<f32>,
    dk_h: Vec<f32>,
    dv_h: Vec<f32>,
}

impl Bufs {
    fn new(plan: &Plan) -> Result<Bufs> {
        let dt = plan.dtype;
        let f = |what: &str| -> Result<Vec<f32>> { try_zeroed(plan.floats(what), what) };
        let t = |what: &str| -> Result<Tensor> { try_tensor(plan.floats(what), dt, what) };
        let none = || Tensor::F32(Vec::new());
        let train = plan.train;
        let per_head = !plan.whole();
        let opt = |on: bool, what: &str| -> Result<Vec<f32>> {
            if on {
                f(what)
            } else {
                Ok(Vec::new())
            }
        };
        let opt_t = |on: bool, what: &str| -> Result<Tensor> {
            if on {
                t(what)
            } else {
                Ok(none())
            }
        };
        Ok(Bufs {
            k: t(plan::K)?,
            v: t(plan::V)?,
            u: f(plan::U)?,
            st1: f(plan::ST1)?,
            qb: t(plan::Q)?,
            ob: f(plan::O)?,
            y: f(plan::Y)?,
            vn: f(plan::VN)?,
            st2: f(plan::ST2)?,
            z: f(plan::Z)?,
            proj: f(plan::PROJ)?,
            g: opt(train, plan::G)?,
            dk: opt(train, plan::DK)?,
            dv: opt(train, plan::DV)?,
            dz: opt(train, plan::DZ)?,
            dvn: opt(train, plan::DVN)?,
            dy: opt(train, plan::DY)?,
            dob: opt(train, plan::DO)?,
            dqb: opt(train, plan::DQ)?,
            du: opt(train, plan::DU)?,
            q_h: opt_t(per_head, plan::Q_H)?,
            o_h: opt(per_head, plan::O_H)?,
            k_h: opt_t(per_head, plan::K_H)?,
            v_h: opt_t(per_head, plan::V_H)?,
            do_h: opt(per_head && train, plan::DO_H)?,
            dq_h: opt(per_head && train, plan::DQ_H)?,
            dk_h: opt(per_head && train, plan::DK_H)?,
            dv_h: opt(per_head && train, plan::DV_H)?,
        })
    }
}

/// Column block `col0..col0 + cols` of a row-major `rows x ld` matrix, as a view.
fn cols(data: &[f32], rows: usize, ld: usize, col0: usize, cols: usize) -> MatRef<'_> {
    MatRef {
        data: &data[col0..],
        rows,
        cols,
        rs: ld,
        cs: 1,
    }
}

/// Rows `row0..row0 + rows` of a row-major `? x ld` matrix, as a view.
fn rows(data: &[f32], row0: usize, rows: usize, ld: usize) -> MatRef<'_> {
    MatRef {
        data: &data[row0 * ld..],
        rows,
        cols: ld,
        rs: ld,
        cs: 1,
    }
}

struct Layer<'a> {
    plan: &'a Plan,
    isa: Isa,
    p: View<'a>,
    x: &'a [f32],
}

impl Layer<'_> {
    fn dims(&self) -> Dims {
        self.plan.dims
    }

    /// Rows of `blk` in a `[b, s, h]` activation (a block's sequences are contiguous there
    /// only one at a time, or all of them when the block is the whole sequence).
    fn block_rows<'b>(&self, data: &'b [f32], blk: &Block) -> &'b [f32] {
        let start = blk.row_offset(&self.dims(), 0);
        &data[start..start + blk.rows() * self.dims().h]
    }

    /// LN1 of the block's tokens into `u` (and `st1`).
    fn ln1(&self, blk: &Block, bufs: &mut Bufs) {
        let h = self.dims().h;
        let n = blk.rows() * h;
        layer_norm(
            self.block_rows(self.x, blk),
            self.p.get(Param::Ln1Gain),
            self.p.get(Param::Ln1Bias),
            &mut bufs.u[..n],
            &mut bufs.st1[..2 * blk.rows()],
        );
    }

    /// Projection `which` (0 = Q, 1 = K, 2 = V) of the block's `u`, head by head, rounded
    /// into `out` (storage dtype) with row stride `d` from `dst(bbl, head)`.
    fn project(
        &self,
        blk: &Block,
        u: &[f32],
        which: usize,
        proj: &mut [f32],
        out: &mut Tensor,
        dst: impl Fn(usize, usize) -> usize,
    ) {
        let Dims { a, d, h, .. } = self.dims();
        let w = self.p.get(Param::Wqkv);
        let bias = self.p.get(Param::Bqkv);
        let o = &mut proj[..blk.c * d];
        for bbl in 0..blk.nb {
            let ub = rows(u, bbl * blk.c, blk.c, h);
            for hd in 0..a {
                let col = which * h + hd * d;
                gemm(1.0, ub, cols(w, h, 3 * h, col, d), 0.0, o, d);
                add_bias(o, d, &bias[col..col + d]);
                store::write(out, dst(bbl, hd), o);
            }
        }
    }

    /// K and V of every token, into the `[b, a, s, d]` stores, block by block.
    fn keys_values(&self, bufs: &mut Bufs) {
        let Dims { a, d, s, .. } = self.dims();
        for blk in self.plan.blocks() {
            self.ln1(&blk, bufs);
            let at = |bbl: usize, hd: usize| (((blk.bb0 + bbl) * a + hd) * s + blk.q0) * d;
            self.project(&blk, &bufs.u, 1, &mut bufs.proj, &mut bufs.k, at);
            self.project(&blk, &bufs.u, 2, &mut bufs.proj, &mut bufs.v, at);
        }
    }

    /// The block's forward up to the FFN pre-activation `z`: LN1, Q, attention (`saved`
    /// receives what its backward needs when training), output projection and residual
    /// into `y`, LN2.
    fn attention_half(
        &self,
        blk: &Block,
        bufs: &mut Bufs,
        saved: Option<&mut Vec<Saved>>,
    ) -> Result<()> {
        let Dims { a, d, h, .. } = self.dims();
        let c = blk.c;
        self.ln1(blk, bufs);
        let at = |bbl: usize, hd: usize| (bbl * a + hd) * c * d;
        self.project(blk, &bufs.u, 0, &mut bufs.proj, &mut bufs.qb, at);
        self.attend(blk, bufs, saved)?;
        // y = x + b_o + sum_heads O_head W_o[head rows]
        let n = blk.rows() * h;
        let (wo, bo) = (self.p.get(Param::Wo), self.p.get(Param::Bo));
        copy_plus_bias(self.block_rows(self.x, blk), bo, &mut bufs.y[..n]);
        for bbl in 0..blk.nb {
            let y = &mut bufs.y[bbl * c * h..][..c * h];
            for hd in 0..a {
                let o = MatRef::new(&bufs.ob[(bbl * a + hd) * c * d..][..c * d], c, d);
                gemm(1.0, o, rows(wo, hd * d, d, h), 1.0, y, h);
            }
        }
        layer_norm(
            &bufs.y[..n],
            self.p.get(Param::Ln2Gain),
            self.p.get(Param::Ln2Bias),
            &mut bufs.vn[..n],
            &mut bufs.st2[..2 * blk.rows()],
        );
        let (w1, b1) = (self.p.get(Param::W1), self.p.get(Param::B1));
        let r = blk.rows();
        let z = &mut bufs.z[..4 * n];
        gemm(
            1.0,
            MatRef::new(&bufs.vn[..n], r, h),
            MatRef::new(w1, h, 4 * h),
            0.0,
            z,
            4 * h,
        );
        add_bias(z, 4 * h, b1);
        Ok(())
    }

    /// Attention of the block's Q (`qb`, by head) over its keys into `ob` (by head); with
    /// `saved`, the training forward, whose state for the backward is pushed there.
    fn attend(
        &self,
        blk: &Block,
        bufs: &mut Bufs,
        mut saved: Option<&mut Vec<Saved>>,
    ) -> Result<()> {
        let plan = self.plan;
        let variant = plan.attention;
        let case = plan.attention_case(blk);
        if plan.whole() {
            let ob = &mut bufs.ob;
            return lend(
                [&mut bufs.qb, &mut bufs.k, &mut bufs.v],
                case.shape,
                |inputs| match saved {
                    Some(saved) => variant
                        .forward_train_cpu(&case, self.isa, inputs, ob)
                        .map(|s| saved.push(s)),
                    None => variant.forward_cpu(&case, self.isa, inputs, ob),
                },
            );
        }
        let Dims { a, d, s, .. } = self.dims();
        let (c, kv) = (blk.c, plan.kv_len(blk));
        for hd in 0..a {
            let kv_at = ((blk.bb0 * a + hd) * s) * d;
            store::refill(&mut bufs.q_h, &bufs.qb, hd * c * d, c * d);
            store::refill(&mut bufs.k_h, &bufs.k, kv_at, kv * d);
            store::refill(&mut bufs.v_h, &bufs.v, kv_at, kv * d);
            bufs.o_h.resize(c * d, 0.0);
            let o_h = &mut bufs.o_h;
            let saved = saved.as_deref_mut();
            lend(
                [&mut bufs.q_h, &mut bufs.k_h, &mut bufs.v_h],
                case.shape,
                |inputs| match saved {
                    Some(saved) => variant
                        .forward_train_cpu(&case, self.isa, inputs, o_h)
                        .map(|sv| saved.push(sv)),
                    None => variant.forward_cpu(&case, self.isa, inputs, o_h),
                },
            )?;
            bufs.ob[hd * c * d..][..c * d].copy_from_slice(&bufs.o_h);
        }
        Ok(())
    }

    /// `out` rows of the block = y + GELU(z) W2 + b2 (GELU in place over `z`).
    fn ffn_out(&self, blk: &Block, bufs: &mut Bufs, out: &mut [f32]) {
        let h = self.dims().h;
        let (n, r) = (blk.rows() * h, blk.rows());
        let z = &mut bufs.z[..4 * n];
        gelu_in_place(z);
        let start = blk.row_offset(&self.dims(), 0);
        let o = &mut out[start..start + n];
        copy_plus_bias(&bufs.y[..n], self.p.get(Param::B2), o);
        let w2 = self.p.get(Param::W2);
        gemm(
            1.0,
            MatRef::new(z, r, 4 * h),
            MatRef::new(w2, 4 * h, h),
            1.0,
            o,
            h,
        );
    }

    fn forward(&self, bufs: &mut Bufs, out: &mut [f32]) -> Result<()> {
        self.keys_values(bufs);
        for blk in self.plan.blocks() {
            self.attention_half(&blk, bufs, None)?;
            self.ffn_out(&blk, bufs, out);
        }
        Ok(())
    }

    /// The checkpointed backward: per block, recompute the forward, back-propagate `d_out`
    /// to dx (rows of the block), the parameters, and dK, dV of every token; then dK, dV
    /// through the K and V projections and LN1.
    fn backward(
        &self,
        bufs: &mut Bufs,
        d_out: &[f32],
        dx: &mut [f32],
        dp: &mut [f32],
    ) -> Result<()> {
        let Dims { a, d, h, s, .. } = self.dims();
        self.keys_values(bufs);
        bufs.dk.fill(0.0);
        bufs.dv.fill(0.0);
        let mut saved = Vec::with_capacity(if self.plan.whole() { 1 } else { a });
        let mut grads = ParamGrads::new(h, dp);
        for blk in self.plan.blocks() {
            saved.clear();
            self.attention_half(&blk, bufs, Some(&mut saved))?;
            let (c, r) = (blk.c, blk.rows());
            let n = r * h;
            let dout = self.block_rows(d_out, &blk);
            let z = &bufs.z[..4 * n];
            let g = &mut bufs.g[..4 * n];
            gelu_into(z, g);
            // FFN out: dW2 += g^T dout, db2, dg = dout W2^T; dz = dg * gelu'(z).
            gemm(
                1.0,
                MatRef::new(g, r, 4 * h).t(),
                MatRef::new(dout, r, h),
                1.0,
                grads.get(Param::W2),
                h,
            );
            add_column_sums(dout, r, h, grads.get(Param::B2));
            let dz = &mut bufs.dz[..4 * n];
            let w2 = self.p.get(Param::W2);
            gemm(
                1.0,
                MatRef::new(dout, r, h),
                MatRef::new(w2, 4 * h, h).t(),
                0.0,
                dz,
                4 * h,
            );
            gelu_backward_in_place(z, dz);
            // FFN in: dW1 += vn^T dz, db1, d vn = dz W1^T.
            let vn = &bufs.vn[..n];
            gemm(
                1.0,
                MatRef::new(vn, r, h).t(),
                MatRef::new(dz, r, 4 * h),
                1.0,
                grads.get(Param::W1),
                4 * h,
            );
            add_column_sums(dz, r, 4 * h, grads.get(Param::B1));
            let w1 = self.p.get(Param::W1);
            let dvn = &mut bufs.dvn[..n];
            gemm(
                1.0,
                MatRef::new(dz, r, 4 * h),
                MatRef::new(w1, h, 4 * h).t(),
                0.0,
                dvn,
                h,
            );
            // LN2 and the residual: dy = dout + LN2'(dvn).
            let (y, st2) = (&bufs.y[..n], &bufs.st2[..2 * r]);
            let dy = &mut bufs.dy[..n];
            dy.copy_from_slice(dout);
            layer_norm_backward(y, st2, self.p.get(Param::Ln2Gain), dvn, dy);
            let (dg2, db2) = grads.pair(Param::Ln2Gain, Param::Ln2Bias);
            layer_norm_param_grads(y, st2, dvn, dg2, db2);
            // Output projection: dW_o[head rows] += O_head^T dy, db_o, dO_head = dy W_o[head rows]^T.
            let wo = self.p.get(Param::Wo);
            add_column_sums(dy, r, h, grads.get(Param::Bo));
            for bbl in 0..blk.nb {
                let dyb = MatRef::new(&dy[bbl * c * h..][..c * h], c, h);
                for hd in 0..a {
                    let at = (bbl * a + hd) * c * d;
                    let o = MatRef::new(&bufs.ob[at..][..c * d], c, d);
                    let dwo = &mut grads.get(Param::Wo)[hd * d * h..][..d * h];
                    gemm(1.0, o.t(), dyb, 1.0, dwo, h);
                    let dob = &mut bufs.dob[at..][..c * d];
                    gemm(1.0, dyb, rows(wo, hd * d, d, h).t(), 0.0, dob, d);
                }
            }
            self.attend_backward(&blk, bufs, &saved)?;
            // Q projection (u and st1 are still the block's): dW_q += u^T dQ_head, db_q,
            // du = sum_heads dQ_head W_q^T.
            let (wqkv, u) = (self.p.get(Param::Wqkv), &bufs.u[..n]);
            for bbl in 0..blk.nb {
                let ub = MatRef::new(&u[bbl * c * h..][..c * h], c, h);
                let du = &mut bufs.du[bbl * c * h..][..c * h];
                for hd in 0..a {
                    let dq = MatRef::new(&bufs.dqb[(bbl * a + hd) * c * d..][..c * d], c, d);
                    let dw = &mut grads.get(Param::Wqkv)[hd * d..];
                    gemm(1.0, ub.t(), dq, 1.0, dw, 3 * h);
                    add_column_sums(dq.data, c, d, &mut grads.get(Param::Bqkv)[hd * d..][..d]);
                    let beta = if hd == 0 { 0.0 } else { 1.0 };
                    gemm(1.0, dq, cols(wqkv, h, 3 * h, hd * d, d).t(), beta, du, h);
                }
            }
            // dx = dy + LN1'(du).
            let start = blk.row_offset(&self.dims(), 0);
            let dxb = &mut dx[start..start + n];
            dxb.copy_from_slice(&bufs.dy[..n]);
            self.ln1_backward(&blk, bufs, dxb, &mut grads);
        }
        drop(saved);
        // dK and dV of every token through their projections and LN1.
        for blk in self.plan.blocks() {
            let (c, n) = (blk.c, blk.rows() * h);
            self.ln1(&blk, bufs);
            let (wqkv, u) = (self.p.get(Param::Wqkv), &bufs.u[..n]);
            for bbl in 0..blk.nb {
                let ub = MatRef::new(&u[bbl * c * h..][..c * h], c, h);
                let du = &mut bufs.du[bbl * c * h..][..c * h];
                for (which, store) in [(1, &bufs.dk), (2, &bufs.dv)] {
                    for hd in 0..a {
                        let at = (((blk.bb0 + bbl) * a + hd) * s + blk.q0) * d;
                        let g = MatRef::new(&store[at..][..c * d], c, d);
                        let col = which * h + hd * d;
                        gemm(
                            1.0,
                            ub.t(),
                            g,
                            1.0,
                            &mut grads.get(Param::Wqkv)[col..],
                            3 * h,
                        );
                        add_column_sums(g.data, c, d, &mut grads.get(Param::Bqkv)[col..][..d]);
                        let beta = if which == 1 && hd == 0 { 0.0 } else { 1.0 };
                        gemm(1.0, g, cols(wqkv, h, 3 * h, col, d).t(), beta, du, h);
                    }
                }
            }
            let start = blk.row_offset(&self.dims(), 0);
            let dxb = &mut dx[start..start + n];
            self.ln1_backward(&blk, bufs, dxb, &mut grads);
        }
        Ok(())
    }

    /// dx += LN1'(du) for the block, and LN1's parameter gradients (`st1` is the block's).
    fn ln1_backward(&self, blk: &Block, bufs: &Bufs, dxb: &mut [f32], grads: &mut ParamGrads) {
        let (n, r) = (blk.rows() * self.dims().h, blk.rows());
        let xb = self.block_rows(self.x, blk);
        let (du, st1) = (&bufs.du[..n], &bufs.st1[..2 * r]);
        layer_norm_backward(xb, st1, self.p.get(Param::Ln1Gain), du, dxb);
        let (dg, db) = grads.pair(Param::Ln1Gain, Param::Ln1Bias);
        layer_norm_param_grads(xb, st1, du, dg, db);
    }

    /// Attention backward of the block: dO (`dob`) to dQ (`dqb`), and dK, dV added into
    /// the all-token stores.
    fn attend_backward(&self, blk: &Block, bufs: &mut Bufs, saved: &[Saved]) -> Result<()> {
        let plan = self.plan;
        let variant = plan.attention;
        let case = plan.attention_case(blk);
        let missing =
            || Error::Runtime("layer: attention backward without its forward state".into());
        if plan.whole() {
            let sv = saved.first().ok_or_else(missing)?;
            let (ob, dob) = (&bufs.ob, &bufs.dob);
            let grads = [&mut bufs.dqb, &mut bufs.dk, &mut bufs.dv];
            return lend(
                [&mut bufs.qb, &mut bufs.k, &mut bufs.v],
                case.shape,
                |inputs| {
                    lend_grads(grads, |g| {
                        variant.backward_cpu(&case, self.isa, inputs, ob, sv, dob, g)
                    })
                },
            );
        }
        let Dims { a, d, s, .. } = self.dims();
        let (c, kv) = (blk.c, plan.kv_len(blk));
        for hd in 0..a {
            let kv_at = ((blk.bb0 * a + hd) * s) * d;
            let at = hd * c * d;
            store::refill(&mut bufs.q_h, &bufs.qb, at, c * d);
            refill(&mut bufs.o_h, &bufs.ob[at..][..c * d]);
            refill(&mut bufs.do_h, &bufs.dob[at..][..c * d]);
            store::refill(&mut bufs.k_h, &bufs.k, kv_at, kv * d);
            store::refill(&mut bufs.v_h, &bufs.v, kv_at, kv * d);
            for (g, len) in [
                (&mut bufs.dq_h, c * d),
                (&mut bufs.dk_h, kv * d),
                (&mut bufs.dv_h, kv * d),
            ] {
                g.clear();
                g.resize(len, 0.0);
            }
            let sv = saved.get(hd).ok_or_else(missing)?;
            let (o_h, do_h) = (&bufs.o_h, &bufs.do_h);
            let grads = [&mut bufs.dq_h, &mut bufs.dk_h, &mut bufs.dv_h];
            lend(
                [&mut bufs.q_h, &mut bufs.k_h, &mut bufs.v_h],
                case.shape,
                |inputs| {
                    lend_grads(grads, |g| {
                        variant.backward_cpu(&case, self.isa, inputs, o_h, sv, do_h, g)
                    })
                },
            )?;
            bufs.dqb[at..][..c * d].copy_from_slice(&bufs.dq_h);
            for (store, part) in [(&mut bufs.dk, &bufs.dk_h), (&mut bufs.dv, &bufs.dv_h)] {
                store[kv_at..][..kv * d]
                    .iter_mut()
                    .zip(part.iter())
                    .for_each(|(a, b)| *a += b);
            }
        }
        Ok(())
    }
}

/// `dst` (whose capacity suffices) becomes a copy of `src`, without reallocating.
fn refill(dst: &mut Vec<f32>, src: &[f32]) {
    dst.clear();
    dst.extend_from_slice(src);
}

/// Lends the Q, K, V buffers to an attention kernel call as its `Inputs` (moved, not
/// copied) and takes them back.
fn lend<R>(qkv: [&mut Tensor; 3], shape: Shape, call: impl FnOnce(&Inputs) -> R) -> R {
    let [q, k, v] = qkv;
    let inputs = Inputs {
        shape,
        q: store::take(q),
        k: store::take(k),
        v: store::take(v),
        paged: Vec::new(),
        fp8: Vec::new(),
        mla: None,
    };
    let r = call(&inputs);
    (*q, *k, *v) = (inputs.q, inputs.k, inputs.v);
    r
}

/// Lends the dQ, dK, dV buffers to a backward call as its `Grads` and takes them back.
fn lend_grads<R>(g: [&mut Vec<f32>; 3], call: impl FnOnce(&mut Grads) -> R) -> R {
    let [dq, dk, dv] = g;
    let mut grads = Grads {
        dq: take(dq),
        dk: take(dk),
        dv: take(dv),
    };
    let r = call(&mut grads);
    (*dq, *dk, *dv) = (grads.dq, grads.dk, grads.dv);
    r
}

/// Named, disjoint views of the flat parameter gradient.
struct ParamGrads<'a> {
    h: usize,
    data: &'a mut [f32],
}

impl<'a> ParamGrads<'a> {
    fn new(h: usize, data: &'a mut [f32]) -> Self {
        ParamGrads { h, data }
    }
    fn get(&mut self, p: Param) -> &mut [f32] {
        &mut self.data[p.range(self.h)]
    }
    fn pair(&mut self, p: Param, q: Param) -> (&mut [f32], &mut [f32]) {
        let (rp, rq) = (p.range(self.h), q.range(self.h));
        assert!(rp.end <= rq.start, "parameters out of order");
        let (lo, hi) = self.data.split_at_mut(rq.start);
        (&mut lo[rp], &mut hi[..rq.len()])
    }
}

/// The layer's forward: `out` (`[b, s, h]`) for input `x` and the flat parameters.
pub fn forward(plan: &Plan, isa: Isa, params: &[f32], x: &[f32], out: &mut [f32]) -> Result<()> {
    let layer = Layer {
        plan,
        isa,
        p: View::new(plan.dims.h, params),
        x,
    };
    let mut bufs = Bufs::new(plan)?;
    layer.forward(&mut bufs, out)
}

/// A checkpointed training step: the forward into `out` (nothing kept but the input), then
/// the backward of `d_out`, which recomputes the forward block by block, into `dx` and the
/// flat parameter gradient `dp` (both overwritten).
#[allow(clippy::too_many_arguments)]
pub fn train(
    plan: &Plan,
    isa: Isa,
    params: &[f32],
    x: &[f32],
    d_out: &[f32],
    out: &mut [f32],
    dx: &mut [f32],
    dp: &mut [f32],
) -> Result<()> {
    let layer = Layer {
        plan,
        isa,
        p: View::new(plan.dims.h, params),
        x,
    };
    let mut bufs = Bufs::new(plan)?;
    layer.forward(&mut bufs, out)?;
    dp.fill(0.0);
    layer.backward(&mut bufs, d_out, dx, dp)
}
