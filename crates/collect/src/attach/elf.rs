//! The ELF files a running Python has mapped: where their symbols are in
//! the process (the file's address plus the load bias found from
//! `/proc/PID/maps`), and what bytes the file holds there (to check that
//! the process runs the file that is on disk). Read only, through the
//! `object` crate; 64-bit little-endian files of this machine's
//! architecture only.

use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};
use object::{Endianness, Object, ObjectSymbol};

/// One `PT_LOAD` segment of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Load {
    pub(crate) offset: u64,
    pub(crate) vaddr: u64,
    pub(crate) filesz: u64,
    pub(crate) exec: bool,
}

/// A parsed ELF file (borrowing its bytes).
pub(crate) struct Elf<'a> {
    file: ElfFile64<'a, Endianness>,
    data: &'a [u8],
}

/// The ELF machine of this build (`EM_X86_64`, `EM_AARCH64`), or 0.
pub(crate) const fn native_machine() -> u16 {
    if cfg!(target_arch = "x86_64") {
        object::elf::EM_X86_64
    } else if cfg!(target_arch = "aarch64") {
        object::elf::EM_AARCH64
    } else {
        0
    }
}

impl<'a> Elf<'a> {
    /// Parses `data`; refuses a file that is not a little-endian 64-bit
    /// ELF for `machine`, naming what it is instead.
    pub(crate) fn parse(data: &'a [u8], machine: u16) -> Result<Elf<'a>, String> {
        if !data.starts_with(b"\x7fELF") {
            return Err("not an ELF file".into());
        }
        let file = ElfFile64::<Endianness>::parse(data)
            .map_err(|e| format!("not a 64-bit ELF file this build can read ({e})"))?;
        let endian = file.endian();
        if endian != Endianness::Little {
            return Err("a big-endian ELF file".into());
        }
        let m = file.elf_header().e_machine(endian);
        if m != machine {
            return Err(format!(
                "an ELF file for another architecture (machine {m}, expected {machine})"
            ));
        }
        Ok(Elf { file, data })
    }

    /// The `PT_LOAD` segments, in file order.
    pub(crate) fn loads(&self) -> Vec<Load> {
        let endian = self.file.endian();
        self.file
            .elf_program_headers()
            .iter()
            .filter(|ph| ph.p_type(endian) == object::elf::PT_LOAD)
            .map(|ph| Load {
                offset: ph.p_offset(endian),
                vaddr: ph.p_vaddr(endian),
                filesz: ph.p_filesz(endian),
                exec: ph.p_flags(endian) & object::elf::PF_X != 0,
            })
            .collect()
    }

    /// The address (in the file's own address space) and size of the
    /// defined symbol `name`: the dynamic symbol table first (what the
    /// dynamic linker sees: a python executable that holds libpython
    /// exports its API there), then the full one when not stripped.
    pub(crate) fn symbol(&self, name: &str) -> Option<(u64, u64)> {
        let wanted = |s: &object::read::elf::ElfSymbol64<'a, '_, Endianness>| {
            !s.is_undefined() && s.address() != 0 && s.name() == Ok(name)
        };
        self.file
            .dynamic_symbols()
            .find(wanted)
            .or_else(|| self.file.symbols().find(wanted))
            .map(|s| (s.address(), s.size()))
    }

    /// `len` bytes of the file at address `vaddr` (inside a `PT_LOAD`'s
    /// file contents), if the file holds them.
    pub(crate) fn bytes_at(&self, vaddr: u64, len: u64) -> Option<&'a [u8]> {
        let end = vaddr.checked_add(len)?;
        let load = self
            .loads()
            .into_iter()
            .find(|l| vaddr >= l.vaddr && end <= l.vaddr.saturating_add(l.filesz))?;
        let start = usize::try_from(load.offset.checked_add(vaddr - load.vaddr)?).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        self.data.get(start..end)
    }

    /// The value of an integer data symbol of at most 8 bytes (such as
    /// CPython's `Py_Version`), little-endian, as the file initialises it.
    pub(crate) fn read_uint(&self, name: &str) -> Option<u64> {
        let (addr, size) = self.symbol(name)?;
        if !(1..=8).contains(&size) {
            return None;
        }
        let bytes = self.bytes_at(addr, size)?;
        let mut buf = [0u8; 8];
        buf[..bytes.len()].copy_from_slice(bytes);
        Some(u64::from_le_bytes(buf))
    }
}

/// The load bias of a file in a process: what to add to the file's
/// addresses to get the process's. From one of its mappings: `start`, the
/// address the byte at file offset `offset` was mapped to. The segment
/// that holds that offset says which address of the file it is (a
/// mapping starts at its segment's offset rounded down to a page, so the
/// offset may sit up to a page, 64 KiB at most, before the segment).
pub(crate) fn load_bias(loads: &[Load], start: u64, offset: u64) -> Option<u64> {
    const MAX_PAGE: u64 = 64 * 1024;
    let inside = loads
        .iter()
        .find(|l| offset >= l.offset && offset < l.offset.saturating_add(l.filesz.max(1)));
    let before = || {
        loads
            .iter()
            .find(|l| offset < l.offset && l.offset - offset < MAX_PAGE)
    };
    let l = inside.or_else(before)?;
    // The file address of the byte at `offset`: the segment's address
    // moved by the distance from its offset (both congruent modulo the
    // page size, as the ELF format requires).
    let vaddr = l.vaddr.wrapping_add(offset).wrapping_sub(l.offset);
    Some(start.wrapping_sub(vaddr))
}

/// A CPython version from `PY_VERSION_HEX` (`Py_Version`, 3.11+):
/// 0x030C04F0 is 3.12.
pub(crate) fn version_from_hex(hex: u64) -> Option<(u32, u32)> {
    let major = ((hex >> 24) & 0xff) as u32;
    let minor = ((hex >> 16) & 0xff) as u32;
    (major == 3 || major == 2).then_some((major, minor))
}

/// A CPython version from a file name: `libpython3.12.so.1.0`,
/// `libpython3.14t.so`, `python3.12`, `python3.13d`.
pub(crate) fn version_from_name(name: &str) -> Option<(u32, u32)> {
    let rest = name
        .strip_prefix("libpython")
        .or_else(|| name.strip_prefix("python"))?;
    let (major, rest) = rest.split_once('.')?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let tail = &rest[digits.len()..];
    // What may follow the minor version: an ABI flag (t, d, m), ".so...", or nothing.
    if !(tail.is_empty() || tail.starts_with(['t', 'd', 'm', '.', '-'])) {
        return None;
    }
    Some((major.parse().ok()?, digits.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attach::procfs;
    use std::io::{Read, Seek, SeekFrom};

    #[test]
    fn bias_from_any_mapping_of_the_file() {
        // A PIE: text at 0x1000 (file 0x1000), data at 0x3df0 (file 0x2df0).
        let loads = [
            Load {
                offset: 0,
                vaddr: 0,
                filesz: 0x800,
                exec: false,
            },
            Load {
                offset: 0x1000,
                vaddr: 0x1000,
                filesz: 0x500,
                exec: true,
            },
            Load {
                offset: 0x2df0,
                vaddr: 0x3df0,
                filesz: 0x220,
                exec: false,
            },
        ];
        let base = 0x5555_5555_4000;
        assert_eq!(load_bias(&loads, base, 0), Some(base));
        assert_eq!(load_bias(&loads, base + 0x1000, 0x1000), Some(base));
        // The data mapping starts at its page: file offset 0x2000, address 0x3000.
        assert_eq!(load_bias(&loads, base + 0x3000, 0x2000), Some(base));
        // A non-PIE executable: its addresses are the process's.
        let exec = [Load {
            offset: 0,
            vaddr: 0x40_0000,
            filesz: 0x1000,
            exec: true,
        }];
        assert_eq!(load_bias(&exec, 0x40_0000, 0), Some(0));
        // An offset no segment holds.
        assert_eq!(load_bias(&loads, base, 0x10_0000), None);
    }

    #[test]
    fn versions_from_names_and_hex() {
        assert_eq!(version_from_name("libpython3.12.so.1.0"), Some((3, 12)));
        assert_eq!(version_from_name("libpython3.14t.so.1.0"), Some((3, 14)));
        assert_eq!(version_from_name("libpython3.9.so"), Some((3, 9)));
        assert_eq!(version_from_name("python3.14"), Some((3, 14)));
        assert_eq!(version_from_name("python3.13d"), Some((3, 13)));
        assert_eq!(version_from_name("python3"), None);
        assert_eq!(version_from_name("python"), None);
        assert_eq!(version_from_name("python3.1x"), None);
        assert_eq!(version_from_name("sleep"), None);
        assert_eq!(version_from_hex(0x030C04F0), Some((3, 12)));
        assert_eq!(version_from_hex(0x030E00A1), Some((3, 14)));
        assert_eq!(version_from_hex(0), None);
    }

    #[test]
    fn refuses_what_is_not_a_native_elf() {
        assert!(Elf::parse(b"#!/bin/sh\n", native_machine()).is_err());
        assert!(Elf::parse(b"\x7fELF\x02\x01\x01", native_machine()).is_err());
        let me = std::fs::read("/proc/self/exe").unwrap();
        assert!(Elf::parse(&me, native_machine()).is_ok());
        let err = Elf::parse(&me, 0x1234).err().expect("refused");
        assert!(err.contains("another architecture"), "{err}");
    }

    /// The symbol lookup end to end on this very process: the C library
    /// it has mapped, `getpid`'s address from the file's symbols and the
    /// load bias from `/proc/self/maps`, and the bytes there in this
    /// process's memory (read through `/proc/self/mem`) are the file's.
    #[test]
    fn libc_symbols_resolve_to_their_code_in_this_process() {
        let maps = procfs::parse_maps(&std::fs::read("/proc/self/maps").unwrap());
        let libc = maps
            .iter()
            .find(|m| m.file_name().is_some_and(procfs::is_libc))
            .expect("this test process maps a C library");
        let path = libc.path.clone().unwrap();
        let data = std::fs::read(&path).unwrap();
        let elf = Elf::parse(&data, native_machine()).unwrap();
        let (addr, size) = elf.symbol("getpid").expect("getpid in libc");
        assert!(size > 0);
        assert_eq!(elf.symbol("no_such_symbol_in_libc"), None);
        let loads = elf.loads();
        assert!(loads.iter().any(|l| l.exec));
        let mut biases: Vec<u64> = maps
            .iter()
            .filter(|m| m.path.as_ref() == Some(&path))
            .map(|m| load_bias(&loads, m.start, m.offset).unwrap())
            .collect();
        biases.dedup();
        assert_eq!(biases.len(), 1, "every mapping gives one bias: {biases:x?}");
        let runtime = addr + biases[0];
        let text = maps
            .iter()
            .find(|m| {
                m.exec && m.path.as_ref() == Some(&path) && (m.start..m.end).contains(&runtime)
            })
            .expect("getpid lies in an executable mapping of libc");
        assert!(runtime < text.end);
        let want = elf.bytes_at(addr, 16).unwrap();
        let mut got = [0u8; 16];
        let mut mem = std::fs::File::open("/proc/self/mem").unwrap();
        mem.seek(SeekFrom::Start(runtime)).unwrap();
        mem.read_exact(&mut got).unwrap();
        assert_eq!(&got[..], want);
    }

    /// CPython's own files, when a python3 is here: the two functions
    /// the injector calls and the version data symbol.
    #[test]
    fn python_symbols_when_a_python_is_here() {
        let Ok(out) = std::process::Command::new("python3")
            .args(["-c", "import sys, sysconfig, os; print(os.path.realpath(sys.executable)); print(sysconfig.get_config_var('LDLIBRARY') or ''); print(sysconfig.get_config_var('LIBDIR') or ''); print('%d.%d' % sys.version_info[:2])"])
            .output()
        else {
            println!("SKIPPED: no python3");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() < 4 {
            println!("SKIPPED: python3 did not answer");
            return;
        }
        let want: Vec<u32> = lines[3].split('.').map(|v| v.parse().unwrap()).collect();
        let candidates = [
            std::path::PathBuf::from(lines[0]),
            std::path::Path::new(lines[2]).join(lines[1]),
        ];
        let mut found = false;
        for c in candidates.iter().filter(|c| c.is_file()) {
            let Ok(data) = std::fs::read(c) else { continue };
            let Ok(elf) = Elf::parse(&data, native_machine()) else {
                continue;
            };
            if elf.symbol("Py_AddPendingCall").is_none() {
                continue;
            }
            assert!(
                elf.symbol("PyRun_SimpleString").is_some(),
                "{}",
                c.display()
            );
            if (want[0], want[1]) >= (3, 11) {
                let hex = elf.read_uint("Py_Version").expect("Py_Version");
                assert_eq!(version_from_hex(hex), Some((want[0], want[1])));
            }
            found = true;
        }
        assert!(found, "no file of {candidates:?} exports Py_AddPendingCall");
    }
}
