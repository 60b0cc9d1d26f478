//! `demo --gpu`: back every simulated segment with real device memory, so
//! NVML and `nvidia-smi` see what the dashboard shows as reserved. CUDA is
//! loaded at run time (cudarc's dynamic loading): the binary builds and runs
//! on machines without it, and `--gpu` then says why it cannot start.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

use vramscope_wire::event::{Event, EventKind};

/// Granularity of backing allocations: expandable segments map and unmap
/// whole pages of 2 MiB (small pool) or 20 MiB (large pool), both multiples.
const CHUNK: u64 = 2 << 20;

/// Device memory standing in for the simulated allocator's segments.
pub struct GpuBacking {
    _ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Backing by simulated address: whole segments, or 2 MiB chunks of
    /// expandable segments.
    held: BTreeMap<u64, CudaSlice<u8>>,
    bytes: u64,
}

impl GpuBacking {
    pub fn new(device: usize) -> Result<Self, String> {
        // cudarc panics when libcuda.so cannot be loaded: turn that into an
        // error, without the panic message on the terminal.
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let ctx = std::panic::catch_unwind(|| CudaContext::new(device));
        std::panic::set_hook(hook);
        let ctx = ctx
            .map_err(|_| {
                "the CUDA driver library (libcuda.so.1) could not be loaded: no NVIDIA driver here"
                    .to_string()
            })?
            .map_err(|e| format!("CUDA device {device}: {e}"))?;
        let stream = ctx.default_stream();
        Ok(GpuBacking {
            _ctx: ctx,
            stream,
            held: BTreeMap::new(),
            bytes: 0,
        })
    }

    /// Bytes of device memory held now.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    fn take(&mut self, addr: u64, size: u64) -> Result<(), String> {
        let slice = self
            .stream
            .alloc_zeros::<u8>(size as usize)
            .map_err(|e| format!("cuMemAlloc of {size} bytes: {e}"))?;
        self.bytes += size;
        if let Some(old) = self.held.insert(addr, slice) {
            self.bytes -= old.len() as u64;
        }
        Ok(())
    }

    fn give(&mut self, addr: u64) {
        if let Some(s) = self.held.remove(&addr) {
            self.bytes -= s.len() as u64;
        }
    }

    /// Returns every byte (a new run of the simulator starts from nothing).
    pub(crate) fn clear(&mut self) {
        self.held.clear();
        self.bytes = 0;
    }

    /// Mirrors one simulator event on the device.
    pub(crate) fn apply(&mut self, e: &Event) -> Result<(), String> {
        match e.kind {
            EventKind::SegmentAlloc { addr, size, .. } => self.take(addr, size),
            EventKind::SegmentFree { addr, .. } => {
                self.give(addr);
                Ok(())
            }
            EventKind::SegmentMap { addr, size, .. } => {
                let mut a = addr;
                while a < addr + size {
                    self.take(a, CHUNK.min(addr + size - a))?;
                    a += CHUNK;
                }
                Ok(())
            }
            EventKind::SegmentUnmap { addr, size, .. } => {
                let keys: Vec<u64> = self
                    .held
                    .range(addr..addr + size)
                    .map(|(k, _)| *k)
                    .collect();
                for k in keys {
                    self.give(k);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}
