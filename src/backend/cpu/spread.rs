//! Software prefetches spread over a kernel's compute steps: the cache lines of up to two
//! runs of memory brought into L2 (`prefetcht1`) an equal share between steps, so the
//! reads of the data a kernel needs next overlap its arithmetic on the data it has. A
//! burst of them ahead of the steps instead fills the core's line-fill buffers and holds
//! the kernel's own loads back behind them (measured on AMX decode and MLA,
//! `docs/internals/decode-path.md`). Cost: one prefetch a line, O(1) state.

/// Two runs of lines, the next line to fetch (counting through `a`'s lines, then `b`'s)
/// and how many each `step` takes.
pub struct Spread {
    a: (*const i8, usize),
    b: (*const i8, usize),
    next: usize,
    share: usize,
}

impl Spread {
    /// The lines of `a` and then `b` (any element type), fetched in `steps` equal shares
    /// (all in the first `step` when `steps` is 0).
    pub fn new<A, B>(a: &[A], b: &[B], steps: usize) -> Spread {
        let lines = |bytes: usize| bytes.div_ceil(64);
        let a = (a.as_ptr() as *const i8, lines(std::mem::size_of_val(a)));
        let b = (b.as_ptr() as *const i8, lines(std::mem::size_of_val(b)));
        Spread {
            a,
            b,
            next: 0,
            share: (a.1 + b.1).div_ceil(steps.max(1)),
        }
    }

    /// Nothing to fetch.
    pub fn none() -> Spread {
        Spread::new::<u8, u8>(&[], &[], 1)
    }

    /// Fetches every line not fetched yet.
    #[inline]
    pub fn all(&mut self) {
        self.share = usize::MAX / 2;
        self.step();
    }

    /// Lines not fetched yet.
    #[cfg(test)]
    pub fn left(&self) -> usize {
        self.a.1 + self.b.1 - self.next
    }

    /// Fetches the next share of lines into L2.
    #[inline(always)]
    pub fn step(&mut self) {
        let (la, end) = (self.a.1, (self.next + self.share).min(self.a.1 + self.b.1));
        for l in self.next..end.min(la) {
            fetch(self.a.0.wrapping_add(64 * l));
        }
        for l in self.next.max(la)..end {
            fetch(self.b.0.wrapping_add(64 * (l - la)));
        }
        self.next = end;
    }
}

/// One line into L2.
#[inline(always)]
fn fetch(p: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address (`step` passes lines of the
    // slices `new` took).
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        _mm_prefetch::<_MM_HINT_T1>(p)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_are_fetched_in_equal_shares_and_then_nothing() {
        let (a, b) = (vec![0u16; 1000], vec![0f32; 33]);
        // 2000 bytes (32 lines) and 132 (3 lines) in 4 steps: shares of 9.
        let mut s = Spread::new(&a, &b, 4);
        assert_eq!(s.left(), 35);
        for left in [26, 17, 8, 0, 0] {
            s.step();
            assert_eq!(s.left(), left);
        }
        let mut all = Spread::new(&a, &b, 0);
        all.step();
        assert_eq!(all.left(), 0);
        let mut none = Spread::none();
        none.step();
        assert_eq!(none.left(), 0);
        // `all` takes what the steps have not, whatever their share.
        let mut rest = Spread::new(&a, &b, 100);
        rest.step();
        assert_eq!(rest.left(), 34);
        rest.all();
        assert_eq!(rest.left(), 0);
    }
}
