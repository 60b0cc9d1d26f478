//! Memory a process holds outside PyTorch's caching allocator (FORMAT.md,
//! "Outside the caching allocator", 1.3): the CUDA context, what NCCL,
//! cuBLAS, cuDNN and other libraries allocate from the driver, the device
//! memory kernels and streams take. Kept by device, library and kind, from
//! the producer's allocations (by address, so a free needs no size) and
//! its totals (which replace what was summed). Bounded: a part or an
//! allocation past the bounds, or a figure no device holds, is refused and
//! counted.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use vramscope_wire::event::{Library, Outside, OutsideKind, OutsideOp};
use vramscope_wire::ring::codec::NO_DEVICE;

/// Parts kept (device × library × kind).
pub(crate) const MAX_PARTS: usize = 1024;
/// Allocations followed by address.
pub(crate) const MAX_LIVE: usize = 65_536;
/// More than any device holds (256 TiB): a figure past it is refused.
pub(crate) const MAX_BYTES: u64 = 1 << 48;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    device: u16,
    library: Library,
    kind: OutsideKind,
}

#[derive(Debug, Clone)]
struct Part {
    bytes: i64,
    /// The library's file name, made printable.
    name: String,
}

/// One process's memory outside the caching allocator.
#[derive(Debug, Clone, Default)]
pub(crate) struct OutsideState {
    parts: BTreeMap<Key, Part>,
    live: HashMap<(u16, u64), (Key, u64)>,
    /// Records refused: past a bound, or a figure no device holds.
    refused: u64,
    /// What the producer says it left out or refused (DROPPED `what` 8,
    /// its running count).
    producer_dropped: u64,
}

/// One part of a process's memory outside the caching allocator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutsidePart {
    /// The device (None: pinned host memory).
    pub device: Option<u16>,
    /// "CUDA", "NCCL", "cuBLAS", …, or the library's file name.
    pub library: String,
    /// "context", "context and earlier" (a late start: the context and
    /// what libraries took before), "allocations", "VMM",
    /// "stream-ordered", "managed", "pinned host", "kernels", "streams",
    /// "other".
    pub kind: String,
    pub bytes: u64,
}

impl OutsidePart {
    /// What the part is called on one line: "context" for the CUDA
    /// context, "context and earlier" for what a late start found, else
    /// its library.
    pub fn what(&self) -> &str {
        if self.kind == CONTEXT || self.kind == CONTEXT_AND_EARLIER {
            &self.kind
        } else {
            &self.library
        }
    }
}

impl OutsideState {
    pub(crate) fn apply(&mut self, r: &Outside) {
        let key = Key {
            device: r.device,
            library: r.library,
            kind: r.kind,
        };
        match r.op {
            OutsideOp::Alloc => {
                let at = (r.device, r.addr);
                if r.bytes > MAX_BYTES
                    || (self.live.len() >= MAX_LIVE && !self.live.contains_key(&at))
                    || !self.part(key, &r.name)
                {
                    self.refused += 1;
                    return;
                }
                // An address still live: its free was lost; it is replaced.
                if let Some((k, b)) = self.live.insert(at, (key, r.bytes)) {
                    self.add(k, -(b as i64));
                }
                self.add(key, r.bytes as i64);
            }
            // The bytes are the allocation's own, as it was followed (a
            // free's figure could say anything).
            OutsideOp::Free => {
                if let Some((k, b)) = self.live.remove(&(r.device, r.addr)) {
                    self.add(k, -(b as i64));
                }
            }
            OutsideOp::Total => {
                let v = r.bytes as i64;
                if v.unsigned_abs() > MAX_BYTES || !self.part(key, &r.name) {
                    self.refused += 1;
                    return;
                }
                if let Some(p) = self.parts.get_mut(&key) {
                    p.bytes = v;
                }
            }
        }
    }

    /// Makes sure `key` has a part (false: no room for another).
    fn part(&mut self, key: Key, name: &[u8; 24]) -> bool {
        if self.parts.contains_key(&key) {
            return true;
        }
        if self.parts.len() >= MAX_PARTS {
            return false;
        }
        let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
        let name = vramscope_text::printable(&String::from_utf8_lossy(&name[..end]));
        self.parts.insert(key, Part { bytes: 0, name });
        true
    }

    fn add(&mut self, key: Key, bytes: i64) {
        if let Some(p) = self.parts.get_mut(&key) {
            p.bytes = p.bytes.saturating_add(bytes);
        }
    }

    /// The device bytes named (pinned host memory is not the device's, and
    /// NVML does not count it), and whether any part holds memory at all:
    /// the view's figures without building the view.
    pub(crate) fn named_on_devices(&self) -> (u64, bool) {
        let mut any = false;
        let mut sum = 0u64;
        for (k, p) in self.parts.iter().filter(|(_, p)| p.bytes > 0) {
            any = true;
            if k.device != NO_DEVICE && k.kind != OutsideKind::Host {
                sum = sum.saturating_add(p.bytes as u64);
            }
        }
        (sum, any)
    }

    /// Records refused here, and those the producer says it dropped.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.saturating_add(self.producer_dropped)
    }

    /// The producer's running count of what it dropped (DROPPED `what` 8).
    pub(crate) fn producer_dropped(&mut self, count: u64) {
        self.producer_dropped = self.producer_dropped.max(count);
    }

    /// Heap bytes held (estimate).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.parts.len() * (std::mem::size_of::<(Key, Part)>() + 24)
            + self.live.capacity() * std::mem::size_of::<((u16, u64), (Key, u64))>()
    }

    /// The parts that hold memory now, largest first (a total below 0, a
    /// drop in free memory the producer took back for a while, as 0).
    pub(crate) fn view(&self) -> Vec<OutsidePart> {
        let mut out: Vec<OutsidePart> = (self.parts.iter())
            .filter(|(_, p)| p.bytes > 0)
            .map(|(k, p)| OutsidePart {
                device: (k.device != NO_DEVICE && k.kind != OutsideKind::Host).then_some(k.device),
                library: library_label(k.library, &p.name),
                kind: kind_label(k.kind).to_string(),
                bytes: p.bytes as u64,
            })
            .collect();
        out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.library.cmp(&b.library)));
        out
    }
}

/// What pinned host memory is called on one line (not the device's: NVML
/// does not count it).
pub const PINNED_HOST: &str = "pinned host";
/// What the parts past the ones named one by one are called on one line.
pub const OTHERS: &str = "others";

/// The parts as one line names them: the device parts summed by
/// [`OutsidePart::what`] (across kinds and devices), largest first, at
/// most `max` (the smallest past `max - 1` summed as [`OTHERS`]); then
/// pinned host memory, all of it, as [`PINNED_HOST`].
pub fn by_what(parts: &[OutsidePart], max: usize) -> Vec<(String, u64)> {
    let mut device: Vec<(String, u64)> = Vec::new();
    let mut host = 0u64;
    for p in parts {
        if p.device.is_none() {
            host = host.saturating_add(p.bytes);
            continue;
        }
        match device.iter_mut().find(|(w, _)| w == p.what()) {
            Some((_, b)) => *b = b.saturating_add(p.bytes),
            None => device.push((p.what().to_string(), p.bytes)),
        }
    }
    device.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    if device.len() > max.max(1) {
        let keep = max.max(1) - 1;
        let rest = (device.drain(keep..)).fold(0u64, |a, (_, b)| a.saturating_add(b));
        device.push((OTHERS.to_string(), rest));
    }
    if host > 0 {
        device.push((PINNED_HOST.to_string(), host));
    }
    device
}

/// The parts and what no one named, on one line: `context 500 MiB ·
/// cuBLAS 32.0 MiB · unexplained 4.00 MiB` (`unexplained —` without NVML);
/// None when the producer names nothing.
pub fn line(parts: &[OutsidePart], unexplained: Option<i64>) -> Option<String> {
    use vramscope_text::format;
    if parts.is_empty() {
        return None;
    }
    let mut items: Vec<String> = (by_what(parts, 6).into_iter())
        .map(|(what, b)| format!("{} {}", vramscope_text::printable(&what), format::bytes(b)))
        .collect();
    items.push(format!(
        "unexplained {}",
        format::opt(unexplained, "—", format::bytes_i64)
    ));
    Some(items.join(" · "))
}

/// One record as the event history says it: `+388M NCCL VMM cuda:0
/// 0x7f1000000000`, `-4.0K PyTorch pinned host`, `= 622M CUDA context
/// cuda:0`.
pub fn describe(o: &Outside) -> String {
    let end = o.name.iter().position(|b| *b == 0).unwrap_or(o.name.len());
    let name = vramscope_text::printable(&String::from_utf8_lossy(&o.name[..end]));
    let (sign, bytes) = match o.op {
        OutsideOp::Alloc => ("+", o.bytes),
        OutsideOp::Free => ("-", o.bytes),
        OutsideOp::Total if (o.bytes as i64) < 0 => ("= -", (o.bytes as i64).unsigned_abs()),
        OutsideOp::Total => ("= ", o.bytes),
    };
    let mut s = format!(
        "{sign}{} {} {}",
        vramscope_text::format::bytes_short(bytes),
        library_label(o.library, &name),
        kind_label(o.kind)
    );
    if o.device != NO_DEVICE && o.kind != OutsideKind::Host {
        s.push_str(&format!(" cuda:{}", o.device));
    }
    if o.op != OutsideOp::Total {
        s.push_str(&format!(" {:#014x}", o.addr));
    }
    s
}

/// A library as users call it; one the format does not name, by its file
/// name.
fn library_label(l: Library, name: &str) -> String {
    match l {
        Library::Cuda => "CUDA",
        Library::Torch => "PyTorch",
        Library::Nccl => "NCCL",
        Library::Cublas => "cuBLAS",
        Library::Cudnn => "cuDNN",
        Library::Cufft => "cuFFT",
        Library::Triton => "Triton",
        Library::TensorRt => "TensorRT",
        Library::CuPy => "CuPy",
        Library::Other(_) if !name.is_empty() => return name.to_string(),
        Library::Other(_) => "other",
    }
    .to_string()
}

/// The CUDA context's kind, measured as the accounting began with CUDA.
const CONTEXT: &str = "context";
/// What the device held outside the allocator as the accounting began
/// late: the context and what libraries took before.
const CONTEXT_AND_EARLIER: &str = "context and earlier";

fn kind_label(k: OutsideKind) -> &'static str {
    match k {
        OutsideKind::Context => CONTEXT,
        OutsideKind::Before => CONTEXT_AND_EARLIER,
        OutsideKind::Allocation => "allocations",
        OutsideKind::Physical => "VMM",
        OutsideKind::StreamOrdered => "stream-ordered",
        OutsideKind::Managed => "managed",
        OutsideKind::Host => "pinned host",
        OutsideKind::Kernels => "kernels",
        OutsideKind::Streams => "streams",
        OutsideKind::Other(_) => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        op: OutsideOp,
        device: u16,
        library: Library,
        kind: OutsideKind,
        addr: u64,
        bytes: u64,
    ) -> Outside {
        let mut name = [0u8; 24];
        name[..12].copy_from_slice(b"libnccl.so.2");
        Outside {
            op,
            device,
            library,
            kind,
            addr,
            bytes,
            name,
        }
    }

    const MIB: u64 = 1 << 20;

    /// Allocations add, frees take back what their allocation held (not
    /// what the free says), totals replace, and the view names each part.
    #[test]
    fn allocations_frees_and_totals_make_the_parts() {
        let mut s = OutsideState::default();
        let (a, f, t) = (OutsideOp::Alloc, OutsideOp::Free, OutsideOp::Total);
        s.apply(&rec(
            t,
            0,
            Library::Cuda,
            OutsideKind::Context,
            0,
            500 * MIB,
        ));
        s.apply(&rec(
            a,
            0,
            Library::Nccl,
            OutsideKind::Physical,
            0x1000,
            200 * MIB,
        ));
        s.apply(&rec(
            a,
            0,
            Library::Nccl,
            OutsideKind::Physical,
            0x2000,
            100 * MIB,
        ));
        s.apply(&rec(f, 0, Library::Nccl, OutsideKind::Physical, 0x2000, 1));
        s.apply(&rec(
            a,
            NO_DEVICE,
            Library::Other(0),
            OutsideKind::Host,
            0x3000,
            MIB,
        ));
        let v = s.view();
        let named: Vec<(&str, &str, u64)> = v
            .iter()
            .map(|p| (p.what(), p.kind.as_str(), p.bytes))
            .collect();
        assert_eq!(
            named,
            [
                ("context", "context", 500 * MIB),
                ("NCCL", "VMM", 200 * MIB),
                ("libnccl.so.2", "pinned host", MIB)
            ]
        );
        assert_eq!(v[2].device, None);
        // A free of an address never allocated changes nothing.
        s.apply(&rec(
            f,
            0,
            Library::Nccl,
            OutsideKind::Physical,
            0x9999,
            5 * MIB,
        ));
        assert_eq!(s.view()[1].bytes, 200 * MIB);
    }

    /// A late start's measurement (kind 9) is not called the context:
    /// "context and earlier" in the parts, the line and the history.
    #[test]
    fn what_a_late_start_found_is_the_context_and_earlier() {
        let mut s = OutsideState::default();
        let late = rec(
            OutsideOp::Total,
            1,
            Library::Cuda,
            OutsideKind::Before,
            0,
            700 * MIB,
        );
        s.apply(&late);
        s.apply(&rec(
            OutsideOp::Alloc,
            1,
            Library::Nccl,
            OutsideKind::Physical,
            0x1000,
            64 * MIB,
        ));
        let v = s.view();
        assert_eq!(
            (v[0].what(), v[0].kind.as_str(), v[0].library.as_str()),
            ("context and earlier", "context and earlier", "CUDA")
        );
        assert_eq!(
            line(&v, Some(0)).unwrap(),
            "context and earlier 700 MiB · NCCL 64.0 MiB · unexplained 0 B"
        );
        assert_eq!(describe(&late), "= 700M CUDA context and earlier cuda:1");
    }

    /// The driver's own memory taken between followed calls (library
    /// CUDA, kind kernels: local memory grown for NCCL's kernels) is a
    /// part of its own, "CUDA", never summed into the context.
    #[test]
    fn the_drivers_kernels_are_cuda_apart_from_the_context() {
        let mut s = OutsideState::default();
        let total = |kind, mib| rec(OutsideOp::Total, 0, Library::Cuda, kind, 0, mib * MIB);
        s.apply(&total(OutsideKind::Context, 532));
        s.apply(&total(OutsideKind::Kernels, 190));
        let v = s.view();
        assert_eq!(
            line(&v, Some(0)).unwrap(),
            "context 532 MiB · CUDA 190 MiB · unexplained 0 B"
        );
        assert_eq!(
            describe(&total(OutsideKind::Kernels, 190)),
            "= 190M CUDA kernels cuda:0"
        );
    }

    fn part(device: Option<u16>, library: &str, kind: &str, mib: u64) -> OutsidePart {
        OutsidePart {
            device,
            library: library.into(),
            kind: kind.into(),
            bytes: mib * MIB,
        }
    }

    /// One line's parts: by what they are called, summed across kinds
    /// and devices, largest first, the smallest past the bound summed as
    /// "others", pinned host memory last; and the line with what no one
    /// named.
    #[test]
    fn parts_by_what_and_on_one_line() {
        let parts = [
            part(Some(0), "CUDA", "context", 500),
            part(Some(1), "CUDA", "context", 500),
            part(Some(0), "NCCL", "VMM", 388),
            part(Some(0), "cuBLAS", "allocations", 96),
            part(Some(1), "cuBLAS", "allocations", 32),
            part(None, "PyTorch", "pinned host", 2),
            part(Some(0), "cuDNN", "streams", 16),
            part(Some(0), "Triton", "kernels", 8),
        ];
        let got = by_what(&parts, 6);
        let names: Vec<(&str, u64)> = got.iter().map(|(w, b)| (w.as_str(), b / MIB)).collect();
        assert_eq!(
            names,
            [
                ("context", 1000),
                ("NCCL", 388),
                ("cuBLAS", 128),
                ("cuDNN", 16),
                ("Triton", 8),
                ("pinned host", 2)
            ]
        );
        let names: Vec<(String, u64)> = (by_what(&parts, 3).into_iter())
            .map(|(w, b)| (w, b / MIB))
            .collect();
        assert_eq!(names[2], ("others".to_string(), 128 + 16 + 8));
        assert_eq!(names.len(), 4);
        assert_eq!(line(&[], Some(5)), None);
        assert_eq!(
            line(&parts[..1], None).unwrap(),
            "context 500 MiB · unexplained —"
        );
        assert_eq!(
            line(&parts[2..4], Some(4 * MIB as i64)).unwrap(),
            "NCCL 388 MiB · cuBLAS 96.0 MiB · unexplained 4.00 MiB"
        );
    }

    /// Hostile figures are refused and counted: bytes past any device, a
    /// flood of tiny allocations past the bound, parts past theirs; names
    /// with escapes come out printable.
    #[test]
    fn hostile_records_are_bounded_and_counted() {
        let mut s = OutsideState::default();
        let a = OutsideOp::Alloc;
        s.apply(&rec(
            a,
            0,
            Library::Cublas,
            OutsideKind::Allocation,
            1,
            u64::MAX,
        ));
        s.apply(&rec(
            OutsideOp::Total,
            0,
            Library::Cuda,
            OutsideKind::Context,
            0,
            1 << 60,
        ));
        assert_eq!(s.refused(), 2);
        for i in 0..(MAX_LIVE as u64 + 10) {
            s.apply(&rec(
                a,
                0,
                Library::Cublas,
                OutsideKind::Allocation,
                0x1000 + i,
                1,
            ));
        }
        assert_eq!(s.refused(), 12);
        assert_eq!(s.view()[0].bytes, MAX_LIVE as u64);
        let mut s = OutsideState::default();
        for code in 0..=255u8 {
            for dev in 0..8u16 {
                let mut r = rec(
                    a,
                    dev,
                    Library::Other(code),
                    OutsideKind::Other(code),
                    u64::from(code) << 20 | u64::from(dev),
                    1,
                );
                r.name = *b"\x1b[2Jlib\xffevil.so\x07\0\0\0\0\0\0\0\0";
                s.apply(&r);
            }
        }
        assert_eq!(s.parts.len(), MAX_PARTS);
        assert_eq!(s.refused(), 256 * 8 - MAX_PARTS as u64);
        let v = s.view();
        assert!(
            v.iter().any(|p| p.library.contains("evil.so")),
            "{:?}",
            v[0]
        );
        for p in v {
            assert!(
                !p.library.contains('\x1b') && !p.library.contains('\x07'),
                "{p:?}"
            );
        }
    }
}
