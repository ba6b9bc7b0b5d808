//! MLA decode's attention on AMX tiles with the cache as the A operand (DeepSeek-V2 Sec.
//! 2.1.2's absorbed form; FA-2's online softmax, Dao 2023): per key block of the latent
//! cache C and RoPE keys K_r, S^T = [C | K_r] Q^T with the cache rows read in place as A
//! tiles and Q^T packed into bf16 pairs once per item, the online softmax down the columns
//! (one query row per lane: maxima and sums are vector operations, no reductions across
//! lanes), P^T rounded to bf16, paired along the keys and transposed 32 bits at a time into
//! P's A tiles, then O = corr O + P C on tiles (C interleaved by pairs of rows). Against
//! `flash_amx::Block` it transposes 32 values a token (P's) instead of d_c + d_r (the key's),
//! since the cache serves only the h x n_q rows of one batch element. Time
//! O(rows n (2 d_c + d_r)); scratch `lens`, O(rows (d_c + d_r + B_c) + B_c d_c) floats.

#![allow(clippy::needless_range_loop)]

use super::flash_amx::round;
use super::spread::Spread;
use super::workspace::carve;

/// Scratch floats, in the order `attend` carves them: Q^T as pairs (bf16), a padded copy
/// of a ragged last key block ([C | K_r] rows, bf16), C_j interleaved by row pairs (bf16),
/// S^T, P^T's pairs (32 bits each), P (bf16, A tiles), the columns' max, sum and correction,
/// and the PV staging; rows and keys rounded up to 32.
pub fn lens(rows: usize, bk: usize, dc: usize, dr: usize) -> [usize; 10] {
    let (nb, kb, dk) = (round(rows), round(bk), dc + dr);
    [
        nb * dk / 2,
        kb * dk / 2,
        kb * dc / 2,
        kb * nb,
        kb * nb / 2,
        nb * kb / 2,
        nb,
        nb,
        nb,
        nb * dc,
    ]
}

/// The rows' attention over keys `k0..k1` of one batch element's cache: `q` holds the rows'
/// [q_lat | q_rope] as bf16 (`rows` x (dc + dr)), `c` and `kr` that element's latent rows
/// and RoPE keys (bf16, all its tokens), row r sees the keys below `hi(r)`. O normalized
/// into `o` (rows x dc), each row's logsumexp (natural log of the scores times `scale`; -inf
/// for a row that saw nothing) into `lse`.
///
/// # Safety
/// `amx::usable()`; dc and dr multiples of 32; `scratch` at least the sum of
/// `lens(rows, bk, dc, dr)`; `q`, `c`, `kr` hold what they name.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn attend(
    q: &[u16],
    (c, kr): (&[u16], &[u16]),
    (rows, dc, dr): (usize, usize, usize),
    (k0, k1, bk): (usize, usize, usize),
    scale: f32,
    hi: &impl Fn(usize) -> usize,
    o: &mut [f32],
    lse: &mut [f32],
    scratch: &mut [f32],
) {
    use std::arch::x86_64::*;

    use super::amx::{self, Tiles};
    use super::simd::avx512::{exp2, exp2_bf16, transpose_block};
    use super::tiles::as_u16;

    let (nb, kb, dk) = (round(rows), round(bk), dc + dr);
    assert!(
        dc % 32 == 0 && dr % 32 == 0 && q.len() >= rows * dk && o.len() >= rows * dc,
        "mla_amx: shapes"
    );
    let [qt, tail, vp, st, pp, pa, m, l, corr, pv] = carve(scratch, lens(rows, bk, dc, dr));
    // Q^T as pairs: row p holds (Q[r][2p], Q[r][2p + 1]) of every row r (zero past `rows`).
    {
        let qt = qt.as_mut_ptr();
        let (qs, pairs) = (q.as_ptr() as *const f32, dk / 2);
        let mut block = [0f32; 256];
        for r0 in (0..nb).step_by(16) {
            for p0 in (0..pairs).step_by(16) {
                for i in 0..16 {
                    let r = r0 + i;
                    let row = &mut block[i * 16..(i + 1) * 16];
                    if r < rows {
                        std::ptr::copy_nonoverlapping(qs.add(r * pairs + p0), row.as_mut_ptr(), 16);
                    } else {
                        row.fill(0.0);
                    }
                }
                transpose_block(block.as_ptr(), 16, qt.add(p0 * nb + r0), nb);
            }
        }
    }
    let (vp, pp, pa) = (as_u16(vp), pp.as_mut_ptr() as *mut u32, as_u16(pa));
    let tail = as_u16(tail);
    o[..rows * dc].fill(0.0);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    let cv = _mm512_set1_ps(scale * std::f32::consts::LOG2_E);
    let neg = _mm512_set1_ps(f32::NEG_INFINITY);
    // Lane i's visible end for the column group of rows 16 v.. (rows past `rows` see
    // nothing), computed per group and block: no allocation in the kernel.
    let his = |v: usize| {
        let e: [i32; 16] = std::array::from_fn(|i| {
            let r = v * 16 + i;
            if r < rows {
                hi(r) as i32
            } else {
                0
            }
        });
        _mm512_loadu_si512(e.as_ptr() as *const _)
    };
    // Pairs of bf16 (token 2t in the low half, 2t + 1 in the high) from the two tokens'
    // 16 lanes: [a0, b0, a1, b1, ...] of cvtne2ps(b, a) = [a0..a15, b0..b15].
    let pair_idx = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    let _tiles = Tiles::configure();

    let mut j0 = k0;
    while j0 < k1 {
        let kn = bk.min(k1 - j0);
        let kw = round(kn);
        // The block's rows in place, or a copy padded with zero rows where it is ragged.
        let (cs, krs, c_ld, kr_ld) = if kn == kw {
            (c.as_ptr().add(j0 * dc), kr.as_ptr().add(j0 * dr), dc, dr)
        } else {
            let (tc, tr) = tail.split_at_mut(kb * dc);
            tc[..kn * dc].copy_from_slice(&c[j0 * dc..(j0 + kn) * dc]);
            tc[kn * dc..kw * dc].fill(0);
            tr[..kn * dr].copy_from_slice(&kr[j0 * dr..(j0 + kn) * dr]);
            tr[kn * dr..kw * dr].fill(0);
            (tc.as_ptr(), tr.as_ptr(), dc, dr)
        };
        super::flash_amx::pack_rows(&c[j0 * dc..(j0 + kn) * dc], kn, dc, vp);

        // The next block's cache lines are fetched into L2 while this block computes, an
        // equal share after each tile step of S^T and PV and each softmax step, so its
        // reads overlap all of this block's work.
        let next = (j0 + kn).min(k1)..(j0 + kn + bk).min(k1);
        let (ws, wv, wm) = (
            kw / 32 * nb / 32 * dk / 32,
            nb / 32 * dc / 32 * kw / 32,
            nb / 16 * kw / 2,
        );
        let mut fetch = Spread::new(
            &c[next.start * dc..next.end * dc],
            &kr[next.start * dr..next.end * dr],
            ws + wv + wm,
        );

        // S^T = [C | K_r] Q^T by 32 x 32 blocks: 32 keys as A (two parts), 32 rows of Q^T.
        let (qtp, sp) = (qt.as_ptr() as *const u8, st.as_mut_ptr() as *mut u8);
        for kt in (0..kw).step_by(32) {
            for qc in (0..nb).step_by(32) {
                amx::product_32x32_between(
                    &[
                        (
                            (cs.add(kt * c_ld) as *const u8, 2 * c_ld),
                            qtp.add(qc * 4),
                            dc / 32,
                        ),
                        (
                            (krs.add(kt * kr_ld) as *const u8, 2 * kr_ld),
                            qtp.add(dc / 2 * nb * 4 + qc * 4),
                            dr / 32,
                        ),
                    ],
                    nb * 4,
                    (sp.add((kt * nb + qc) * 4), nb * 4),
                    &mut || fetch.step(),
                );
            }
        }

        // The online softmax down each column group of 16 rows: a key row t is seen by the
        // lanes whose end is past j0 + t.
        for v in 0..nb / 16 {
            let hv = his(v);
            let seen = |t: usize| -> __mmask16 {
                if t >= kn {
                    return 0;
                }
                _mm512_cmpgt_epi32_mask(hv, _mm512_set1_epi32((j0 + t) as i32))
            };
            let col = |t: usize| st.as_ptr().add(t * nb + v * 16);
            let mut mx = neg;
            for t in 0..kn {
                mx = _mm512_mask_max_ps(mx, seen(t), mx, _mm512_loadu_ps(col(t)));
            }
            let m_old = _mm512_loadu_ps(m.as_ptr().add(v * 16));
            let m_new = _mm512_max_ps(m_old, _mm512_mul_ps(mx, cv));
            let none = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m_new, neg);
            // -m' where something is seen (0 elsewhere, so no -inf - -inf).
            let nm = _mm512_maskz_sub_ps(!none, _mm512_setzero_ps(), m_new);
            let cr = _mm512_mask_mov_ps(exp2(_mm512_add_ps(m_old, nm)), none, _mm512_set1_ps(1.0));
            let mut sum = _mm512_setzero_ps();
            for t in (0..kw).step_by(2) {
                fetch.step();
                let p_at = |t: usize| {
                    let x = _mm512_fmadd_ps(_mm512_loadu_ps(col(t)), cv, nm);
                    _mm512_maskz_mov_ps(seen(t), exp2_bf16(x))
                };
                let (a, b) = (p_at(t), p_at(t + 1));
                sum = _mm512_add_ps(sum, _mm512_add_ps(a, b));
                let ab: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
                let pairs = _mm512_permutexvar_epi16(pair_idx, ab);
                _mm512_storeu_si512(pp.add(t / 2 * nb + v * 16) as *mut _, pairs);
            }
            let l_old = _mm512_loadu_ps(l.as_ptr().add(v * 16));
            _mm512_storeu_ps(l.as_mut_ptr().add(v * 16), _mm512_fmadd_ps(l_old, cr, sum));
            _mm512_storeu_ps(m.as_mut_ptr().add(v * 16), m_new);
            _mm512_storeu_ps(corr.as_mut_ptr().add(v * 16), cr);
        }
        // P's A tiles: row r holds its pairs along the keys (P^T's pairs transposed).
        for t0 in (0..kw / 2).step_by(16) {
            for r0 in (0..nb).step_by(16) {
                transpose_block(
                    pp.add(t0 * nb + r0) as *const f32,
                    nb,
                    pa.as_mut_ptr().add(r0 * kb + 2 * t0) as *mut f32,
                    kb / 2,
                );
            }
        }

        // PV = P C_j by 32 x 32 blocks; O = corr O + PV.
        let (pap, vpp, pvp) = (
            pa.as_ptr() as *const u8,
            vp.as_ptr() as *const u8,
            pv.as_mut_ptr() as *mut u8,
        );
        for qc in (0..nb).step_by(32) {
            for dt in (0..dc).step_by(32) {
                amx::product_32x32_between(
                    &[((pap.add(qc * kb * 2), kb * 2), vpp.add(dt * 4), kw / 32)],
                    4 * dc,
                    (pvp.add((qc * dc + dt) * 4), 4 * dc),
                    &mut || fetch.step(),
                );
            }
        }
        for r in 0..rows {
            let cr = _mm512_set1_ps(corr[r]);
            let (orow, prow) = (o.as_mut_ptr().add(r * dc), pv.as_ptr().add(r * dc));
            for x in (0..dc).step_by(16) {
                let y = _mm512_fmadd_ps(
                    _mm512_loadu_ps(orow.add(x)),
                    cr,
                    _mm512_loadu_ps(prow.add(x)),
                );
                _mm512_storeu_ps(orow.add(x), y);
            }
        }
        j0 += kn;
    }
    drop(_tiles);
    for r in 0..rows {
        let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
        for y in &mut o[r * dc..(r + 1) * dc] {
            *y *= inv;
        }
        lse[r] = if l[r] > 0.0 {
            m[r] * std::f32::consts::LN_2 + l[r].ln()
        } else {
            f32::NEG_INFINITY
        };
    }
}
