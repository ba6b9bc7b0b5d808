//! The Tree Attention paper's peak-memory and communication-volume formulas, eqs. (8)-(14)
//! (Shyam et al. Sec. 6.2-6.3; docs/papers.md, Shyam et al.), in tensor elements, for one decode query
//! per sequence, d = d_h·n_h and t = N/p. Eq. (10) is per ring iteration summed over the
//! devices (= 2·b·N·d for any p); eqs. (12) and (14) are per device. O(1) each.

/// The paper's variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub b: u64,
    /// Keys and values per device.
    pub t: u64,
    pub n_h: u64,
    pub d_h: u64,
    pub p: u64,
}

impl Dims {
    /// Hidden size d = d_h·n_h.
    pub fn d(&self) -> u64 {
        self.d_h * self.n_h
    }
}

/// (8) Mem_ring = 4btd + 2bd: own k, v shard, the visiting one, q and o.
pub fn mem_ring(x: &Dims) -> u64 {
    4 * x.b * x.t * x.d() + 2 * x.b * x.d()
}

/// (9) Mem_tree = 2btd + 2bd + 2bn_h: k, v shard, q, numerator, denominator and max.
pub fn mem_tree(x: &Dims) -> u64 {
    2 * x.b * x.t * x.d() + 2 * x.b * x.d() + 2 * x.b * x.n_h
}

/// (10) V_ring = 2btd·p: every device's k, v shard moves once per iteration.
pub fn v_ring(x: &Dims) -> u64 {
    numel_kv(x) * x.p
}

/// (11) numel(k, v) = 2btd.
pub fn numel_kv(x: &Dims) -> u64 {
    2 * x.b * x.t * x.d()
}

/// (12) V_Allreduce = 2(p-1)/p·numel, per device.
pub fn v_allreduce(p: u64, numel: u64) -> f64 {
    2.0 * (p as f64 - 1.0) / p as f64 * numel as f64
}

/// (13) numel(n, d, m) = bd + 2bn_h.
pub fn numel_ndm(x: &Dims) -> u64 {
    x.b * x.d() + 2 * x.b * x.n_h
}

/// (14) V_Tree = 2(p-1)/p·(bd + 2bn_h), per device.
pub fn v_tree(x: &Dims) -> f64 {
    v_allreduce(x.p, numel_ndm(x))
}

/// Eq. (14) summed over the p devices, an integer: 2(p-1)(bd + 2bn_h).
pub fn v_tree_total(x: &Dims) -> u64 {
    2 * (x.p - 1) * numel_ndm(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/papers.md, Shyam et al.'s fixtures: b = 1, n_h = 16, d_h = 128.
    #[test]
    fn paper_fixtures() {
        let a = Dims {
            b: 1,
            t: 640_000 / 8,
            n_h: 16,
            d_h: 128,
            p: 8,
        };
        assert_eq!(v_ring(&a), 2_621_440_000); // 2.6214e9
        assert_eq!(v_tree(&a), 3640.0);
        assert_eq!(mem_ring(&a), 655_364_096);
        assert_eq!(mem_tree(&a), 327_684_128);
        let b = Dims {
            t: 5_120_000 / 128,
            p: 128,
            ..a
        };
        assert_eq!(v_ring(&b), 20_971_520_000); // 2.0972e10
        assert_eq!(v_tree(&b), 4127.5);
        assert_eq!(mem_ring(&b), 327_684_096);
        assert_eq!(mem_tree(&b), 163_844_128);
        assert_eq!(v_tree_total(&b) as f64 / 128.0, v_tree(&b));
    }

    #[test]
    fn ring_volume_per_iteration_is_2bnd_for_any_p() {
        for p in [1u64, 2, 5, 8, 128] {
            let x = Dims {
                b: 3,
                t: 1280 / p,
                n_h: 4,
                d_h: 32,
                p,
            };
            assert_eq!(v_ring(&x), 2 * 3 * 1280 * 128);
        }
    }

    /// The paper's §6.2 example: doubling the hidden size doubles the gap (bf16 bytes,
    /// b·t = 64000 as in `tree_shard_test.py`): 524 MB -> 1048 MB.
    #[test]
    fn memory_gap_doubles_with_the_hidden_size() {
        let gap = |n_h: u64| {
            let x = Dims {
                b: 1,
                t: 64_000,
                n_h,
                d_h: 128,
                p: 8,
            };
            2 * (mem_ring(&x) - mem_tree(&x))
        };
        assert_eq!(gap(16), 524_287_936);
        assert_eq!(gap(32), 1_048_575_872);
    }
}
