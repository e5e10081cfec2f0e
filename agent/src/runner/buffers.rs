//! The IO buffers of one clone.

use crate::budget;
use crate::layout;

/// IO buffers: one `max_bs` buffer per slot, 4 KiB aligned for O_DIRECT, in one allocation.
pub(super) struct Buffers {
    pub(super) ptr: *mut u8,
    pub(super) layout: std::alloc::Layout,
    slot_len: usize,
}

impl Buffers {
    /// Allocates and fills the buffers; running out of memory is an error for the clone (the
    /// budget checked before IO makes it rare), never an abort of the whole agent.
    pub(super) fn new(slots: usize, slot_len: usize, seed: u64) -> Result<Self, String> {
        let slot_len = slot_len.next_multiple_of(4096);
        let size = slots.checked_mul(slot_len);
        let layout = size
            .and_then(|size| std::alloc::Layout::from_size_align(size, 4096).ok())
            .ok_or_else(|| {
                format!("{slots} IO buffers of {slot_len} bytes do not fit in memory")
            })?;
        // SAFETY: non-zero size (slots >= 1, slot_len >= 4096).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(format!(
                "cannot allocate {} of IO buffers (iodepth x largest bs); lower iodepth or bs",
                budget::gib(layout.size() as u64)
            ));
        }
        // SAFETY: ptr is valid for layout.size() bytes, owned by us.
        let all = unsafe { std::slice::from_raw_parts_mut(ptr, layout.size()) };
        layout::fill_pseudo_random(all, seed);
        Ok(Buffers {
            ptr,
            layout,
            slot_len,
        })
    }
    pub(super) fn slot(&self, i: usize) -> *mut u8 {
        // SAFETY: i < slots, so the offset stays inside the allocation.
        unsafe { self.ptr.add(i * self.slot_len) }
    }
    /// A slot's bytes to read (a finished write's data, handed to its mirror).
    pub(super) fn bytes(&self, i: usize, len: usize) -> &[u8] {
        let len = len.min(self.slot_len);
        // SAFETY: inside the slot's part of the allocation; no IO using it is in flight.
        unsafe { std::slice::from_raw_parts(self.slot(i), len) }
    }
    pub(super) fn slice(&mut self, i: usize, len: usize) -> &mut [u8] {
        // SAFETY: the slot is ours while no IO using it is in flight (caller's invariant).
        unsafe { std::slice::from_raw_parts_mut(self.slot(i), len) }
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gRPC fuzz test drove a run into iodepth x bs buffers of many GiB (bs=1g); under a
    /// memory limit such an allocation fails, and that failure (or an overflow of the size)
    /// panicked the clone, which took the agent's whole run down with it. Now the clone fails
    /// with a message.
    #[test]
    fn impossible_io_buffers_are_an_error_not_a_panic() {
        for (slots, slot_len) in [(usize::MAX / 4096 + 1, 4096), (1 << 20, 1 << 30)] {
            let err = Buffers::new(slots, slot_len, 1)
                .err()
                .expect("no such allocation");
            assert!(
                err.contains("do not fit in memory") || err.contains("cannot allocate"),
                "{err}"
            );
        }
        let b = Buffers::new(2, 1, 1).expect("two 4 KiB slots");
        assert_eq!(b.slot_len, 4096);
    }
}
