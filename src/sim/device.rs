//! The memory of one simulated device: the tensors it holds (named), counted in elements
//! (the unit of the Tree Attention paper's eqs. (8)-(9)) and in bytes, with the peak and
//! what was live at the peak. Messages in flight belong to the links, not to a device (as
//! NCCL's staging buffers are not tensors), and kernel tiles are the device's on-chip
//! scratch; neither is counted here. O(live tensors) per event.

/// One tensor held by a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub name: &'static str,
    pub elements: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    live: Vec<Held>,
    pub peak_elements: u64,
    pub peak_bytes: u64,
    /// The tensors live when `peak_elements` was reached.
    pub at_peak: Vec<Held>,
}

impl DeviceMemory {
    pub fn live_elements(&self) -> u64 {
        self.live.iter().map(|h| h.elements).sum()
    }

    pub fn live_bytes(&self) -> u64 {
        self.live.iter().map(|h| h.bytes).sum()
    }

    /// The device now holds `elements` elements of `elem_bytes` bytes each, as `name`.
    pub fn hold(&mut self, name: &'static str, elements: usize, elem_bytes: usize) {
        self.live.push(Held {
            name,
            elements: elements as u64,
            bytes: (elements * elem_bytes) as u64,
        });
        let (e, b) = (self.live_elements(), self.live_bytes());
        if e > self.peak_elements {
            self.peak_elements = e;
            self.at_peak = self.live.clone();
        }
        self.peak_bytes = self.peak_bytes.max(b);
    }

    /// The tensor `name` is gone (freed, or sent away); the most recent one of that name.
    pub fn release(&mut self, name: &'static str) {
        if let Some(i) = self.live.iter().rposition(|h| h.name == name) {
            self.live.remove(i);
        }
    }

    /// Renames a tensor transformed in place (e.g. the local output becoming the numerator).
    pub fn rename(&mut self, from: &'static str, to: &'static str) {
        if let Some(h) = self.live.iter_mut().rev().find(|h| h.name == from) {
            h.name = to;
        }
    }

    /// Elements at the peak held under `name`.
    pub fn peak_of(&self, name: &str) -> u64 {
        self.at_peak
            .iter()
            .filter(|h| h.name == name)
            .map(|h| h.elements)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_and_breakdown() {
        let mut m = DeviceMemory::default();
        m.hold("q", 4, 2);
        m.hold("kv", 10, 2);
        m.release("kv");
        m.hold("o", 4, 4);
        m.rename("o", "n");
        assert_eq!((m.peak_elements, m.peak_bytes), (14, 28));
        assert_eq!(m.peak_of("kv"), 10);
        assert_eq!((m.live_elements(), m.live_bytes()), (8, 24));
    }
}
