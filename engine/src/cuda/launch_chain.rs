//! Chaining of a decode step's launches (profile key `decode_launch`).
//!
//! Chained, every kernel launch of the captured decode step after the first
//! is a programmatic dependent of the launch before it (PDL on sm_90,
//! `Kernel::launch_dependent`; a plain launch below): the driver schedules
//! its blocks as soon as every block of that grid has released its
//! dependents, and each block waits on the device (`griddepcontrol.wait`)
//! until that grid has completed and its writes are visible. Every kernel
//! source begins with that wait (`pdl_enter`, kernels/cuda/common.cuh), so
//! the arithmetic and the order of every read and write are those of plain
//! stream order; what overlaps the grid ahead is the launch itself, the
//! blocks' start-up, and work that reads nothing it writes (the decode
//! attention's copies of the cache's older keys, the split-activation
//! GEMV's first L2 prefetches).
//!
//! A grid's completion stands for its predecessors' only because it waited
//! for them, so the chain holds only across kernels: after any other stream
//! operation (a fill, a copy, a cuBLAS call) the next launch is plain.

use std::cell::Cell;

/// Whether the next launch may be a programmatic dependent.
#[derive(Debug, Default)]
pub struct LaunchChain {
    on: Cell<bool>,
    after_kernel: Cell<bool>,
    chained: Cell<u64>,
}

impl LaunchChain {
    /// Starts chaining: the next launch is still plain (it follows the
    /// step's input upload), the ones after it are chained.
    pub fn begin(&self) {
        self.on.set(true);
        self.after_kernel.set(false);
    }
    /// Stops chaining (the end of the step).
    pub fn end(&self) {
        self.on.set(false);
        self.after_kernel.set(false);
    }
    /// Whether the kernel launch about to be enqueued is chained to the
    /// one before; records that a kernel was launched.
    pub fn next_launch(&self) -> bool {
        let chained = self.on.get() && self.after_kernel.get();
        self.after_kernel.set(true);
        self.chained.set(self.chained.get() + u64::from(chained));
        chained
    }
    /// Launches enqueued as chained so far (each capture counts once).
    pub fn chained(&self) -> u64 {
        self.chained.get()
    }
    /// A kernel was launched by other means (the attention's own sequence).
    pub fn kernel_launched(&self) {
        self.after_kernel.set(true);
    }
    /// A stream operation that is not a kernel launch was enqueued: the
    /// next launch waits in stream order.
    pub fn other_op(&self) {
        self.after_kernel.set(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kernels_after_kernels_are_chained_while_on() {
        let c = LaunchChain::default();
        assert!(!c.next_launch(), "off: plain");
        c.begin();
        assert!(!c.next_launch(), "the step's first launch is plain");
        assert!(c.next_launch());
        c.other_op();
        assert!(!c.next_launch(), "after a fill or copy: plain");
        c.kernel_launched();
        assert!(c.next_launch());
        c.end();
        assert!(!c.next_launch(), "ended: plain");
        assert_eq!(c.chained(), 2);
    }
}
