//! The two products `naive` and Rabe–Staats (`chunked`) compute per strip of query rows, on
//! f32 or bf16-pair operands: S = Q K^T against K^T packed in 64-key panels, and O = P V
//! (Rabe & Staats, Figure 1's `summarize_chunk`; standard attention). Both are `tiles` GEMMs
//! (bf16 pairs on the amx-bf16 path: `amx_gemm`'s tile products), so the two algorithms
//! share them to the instruction. Cost: 2 * rows * keys * d FLOPs each.

use super::isa::Isa;
use super::tiles::{gemm, gemm_bf16, AOp, BOp, Out, PANEL};

/// C = A B on bf16 pairs, for each (A, B, C offset) of `parts` in turn (row stride `ldc`):
/// on AMX tiles on the amx-bf16 path (configured once for all the parts), else on
/// `vdpbf16ps` tiles.
fn pair_products<'a>(
    isa: Isa,
    parts: impl Iterator<Item = (AOp<'a, u16>, BOp<'a, u16>, usize)>,
    c: &mut [f32],
    ldc: usize,
) {
    if isa == Isa::AmxBf16 {
        assert!(isa.available(), "the AMX tiles are not usable here");
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the tiles are usable (asserted) and configured for the loop.
        unsafe {
            let _tiles = super::amx::Tiles::configure();
            for (a, b, at) in parts {
                super::amx_gemm::gemm(a, b, &mut c[at..], ldc);
            }
        }
        return;
    }
    for (a, b, at) in parts {
        gemm_bf16(isa, a, b, &mut c[at..], ldc, Out::Store);
    }
}

/// An operand as the tiles read it: f32 values, or bf16 values in pairs for `vdpbf16ps`.
#[derive(Clone, Copy)]
pub enum Operand<'a> {
    F32(&'a [f32]),
    Pairs(&'a [u16]),
}

impl<'a> Operand<'a> {
    /// The `len` values from `start`.
    pub fn slice(self, start: usize, len: usize) -> Operand<'a> {
        match self {
            Operand::F32(x) => Operand::F32(&x[start..][..len]),
            Operand::Pairs(x) => Operand::Pairs(&x[start..][..len]),
        }
    }
    /// The values from `start` on.
    pub fn skip(self, start: usize) -> Operand<'a> {
        match self {
            Operand::F32(x) => Operand::F32(&x[start..]),
            Operand::Pairs(x) => Operand::Pairs(&x[start..]),
        }
    }
}

/// Raw scores `s[i][j] = q_i . k_j` of `rows` query rows (`q`: rows of d values) against
/// the first `keys` keys of `kt`, K^T in 64-key panels (`tiles::pack_t`, or
/// `tiles::pack_pairs_t` for pairs), into `s` with row stride `lds`. `q` and `kt` take the
/// same path.
#[allow(clippy::too_many_arguments)]
pub fn scores(
    isa: Isa,
    q: Operand,
    kt: Operand,
    rows: usize,
    d: usize,
    keys: usize,
    s: &mut [f32],
    lds: usize,
) {
    let panels = (0..keys).step_by(PANEL).enumerate();
    let panels = panels.map(|(pi, j0)| (pi * PANEL * d, j0, PANEL.min(keys - j0)));
    if let (Operand::Pairs(q), Operand::Pairs(kt)) = (q, kt) {
        let a = AOp {
            data: q,
            rows,
            k: d / 2,
            rs: d,
            cs: 2,
        };
        let parts = panels.map(|(panel, j0, jn)| {
            let b = BOp {
                data: &kt[panel..][..PANEL * d],
                k: d / 2,
                n: jn,
                ld: 2 * PANEL,
            };
            (a, b, j0)
        });
        return pair_products(isa, parts, s, lds);
    }
    for (panel, j0, jn) in panels {
        match (q, kt) {
            (Operand::F32(q), Operand::F32(kt)) => {
                let a = AOp {
                    data: q,
                    rows,
                    k: d,
                    rs: d,
                    cs: 1,
                };
                let b = BOp {
                    data: &kt[panel..][..PANEL * d],
                    k: d,
                    n: jn,
                    ld: PANEL,
                };
                gemm(isa, a, b, &mut s[j0..], lds, Out::Store);
            }
            _ => panic!("the query and the keys take different operand paths"),
        }
    }
}

/// `o = p v` over the first `keys` keys for `rows` rows (row stride `ldo`): `p` rows of
/// stride `lds` (values of its own type) and `v` rows of d, both f32; or both bf16 pairs,
/// `v` in row pairs `[ceil(keys/2)][d][2]` (`tiles::interleave_rows`).
#[allow(clippy::too_many_arguments)]
pub fn values(
    isa: Isa,
    p: Operand,
    lds: usize,
    v: Operand,
    rows: usize,
    keys: usize,
    d: usize,
    o: &mut [f32],
    ldo: usize,
) {
    match (p, v) {
        (Operand::Pairs(p), Operand::Pairs(v)) => {
            let pairs = keys.div_ceil(2);
            let a = AOp {
                data: p,
                rows,
                k: pairs,
                rs: lds,
                cs: 2,
            };
            let b = BOp {
                data: &v[..pairs * 2 * d],
                k: pairs,
                n: d,
                ld: 2 * d,
            };
            pair_products(isa, std::iter::once((a, b, 0)), o, ldo);
        }
        (Operand::F32(p), Operand::F32(v)) => {
            let a = AOp {
                data: p,
                rows,
                k: keys,
                rs: lds,
                cs: 1,
            };
            let b = BOp {
                data: &v[..keys * d],
                k: keys,
                n: d,
                ld: d,
            };
            gemm(isa, a, b, o, ldo, Out::Store);
        }
        _ => panic!("the probabilities and the values take different operand paths"),
    }
}
