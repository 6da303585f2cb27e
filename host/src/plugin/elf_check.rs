//! A look at a plugin library file before `dlopen` gets it.
//!
//! The dynamic loader trusts a file's program headers: it maps every `PT_LOAD` segment where
//! they say, and a segment that reaches past the end of the file (a truncated copy, a download
//! cut short) is mapped anyway and kills the process with SIGBUS as soon as the loader touches
//! it. No error comes back, so no fallback can happen. [`check_library`] reads the ELF header
//! and program headers itself and refuses such a file, with the reason, before `dlopen` sees
//! it: the file must be a readable regular file, not empty, begin with the ELF magic, be of
//! this build's class (32/64-bit), byte order and machine, be a shared object (`ET_DYN`), have
//! its program header table inside the file, and every `PT_LOAD` segment's file range
//! (`p_offset + p_filesz`) inside the file.
//!
//! Not covered: a file that changes between this check and `dlopen`, and libraries the plugin
//! itself depends on (`DT_NEEDED`), which the loader finds and maps on its own.
//!
//! A small hand parser (the header and program header layouts are fixed by the ELF
//! specification); no crate in the build reads ELF.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Why a file cannot be loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unfit {
    /// For a person, e.g. "truncated: PT_LOAD segment 3 ends at byte 12288 of a 4096-byte file".
    pub reason: String,
    /// An ELF file built for another machine or class (32/64-bit). The dynamic loader passes
    /// over such files while it searches its directories for a library name (that is how 32-
    /// and 64-bit libraries share a search path), so a name search does too.
    pub foreign: bool,
}

impl Unfit {
    fn broken(reason: impl Into<String>) -> Unfit {
        Unfit { reason: reason.into(), foreign: false }
    }

    fn foreign(reason: impl Into<String>) -> Unfit {
        Unfit { reason: reason.into(), foreign: true }
    }
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

const MAGIC: &[u8; 4] = b"\x7fELF";
const ELFCLASS32: u8 = 1;
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const ELFDATA2MSB: u8 = 2;
const EV_CURRENT: u8 = 1;
const ET_DYN: u16 = 3;
const PT_LOAD: u32 = 1;

/// `e_machine` values and the names Rust gives the architectures (`std::env::consts::ARCH`).
const MACHINES: &[(u16, &str)] = &[
    (3, "x86"),
    (8, "mips"),
    (20, "powerpc"),
    (21, "powerpc64"),
    (22, "s390x"),
    (40, "arm"),
    (43, "sparc64"),
    (62, "x86_64"),
    (183, "aarch64"),
    (243, "riscv64"),
    (258, "loongarch64"),
];

/// The ELF file properties this build loads.
#[derive(Clone, Copy, Debug)]
struct Host {
    class: u8,
    data: u8,
    /// `None` on an architecture missing from [`MACHINES`]: the machine is then not checked.
    machine: Option<u16>,
}

fn host() -> Host {
    let arch = std::env::consts::ARCH;
    // riscv32 and riscv64 share EM_RISCV, mips and mips64 share EM_MIPS.
    let arch = match arch {
        "riscv32" => "riscv64",
        "mips64" => "mips",
        a => a,
    };
    Host {
        class: if cfg!(target_pointer_width = "64") { ELFCLASS64 } else { ELFCLASS32 },
        data: if cfg!(target_endian = "little") { ELFDATA2LSB } else { ELFDATA2MSB },
        machine: MACHINES.iter().find(|(_, name)| *name == arch).map(|(m, _)| *m),
    }
}

fn class_name(class: u8) -> &'static str {
    if class == ELFCLASS64 {
        "64-bit"
    } else {
        "32-bit"
    }
}

fn data_name(data: u8) -> &'static str {
    if data == ELFDATA2LSB {
        "little-endian"
    } else {
        "big-endian"
    }
}

fn machine_name(machine: u16) -> String {
    match MACHINES.iter().find(|(m, _)| *m == machine) {
        Some((_, name)) => name.to_string(),
        None => format!("machine {machine}"),
    }
}

/// Sizes of the structures of one ELF class.
struct Layout {
    header: usize,
    phentsize: usize,
}

fn layout(class: u8) -> Layout {
    if class == ELFCLASS64 {
        Layout { header: 64, phentsize: 56 }
    } else {
        Layout { header: 52, phentsize: 32 }
    }
}

/// Reads fixed-size fields in the file's byte order.
struct Fields<'a> {
    bytes: &'a [u8],
    big: bool,
}

impl Fields<'_> {
    fn u16(&self, at: usize) -> u16 {
        let b = [self.bytes[at], self.bytes[at + 1]];
        if self.big {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        }
    }

    fn u32(&self, at: usize) -> u32 {
        let b: [u8; 4] = self.bytes[at..at + 4].try_into().expect("4 bytes");
        if self.big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }

    fn u64(&self, at: usize) -> u64 {
        let b: [u8; 8] = self.bytes[at..at + 8].try_into().expect("8 bytes");
        if self.big {
            u64::from_be_bytes(b)
        } else {
            u64::from_le_bytes(b)
        }
    }

    /// An address-sized field (`u32` in ELF32, `u64` in ELF64), widened.
    fn word(&self, at: usize, class: u8) -> u64 {
        if class == ELFCLASS64 {
            self.u64(at)
        } else {
            u64::from(self.u32(at))
        }
    }
}

/// Checks that `path` is a library this process can hand to `dlopen` without the loader
/// tripping over it (see the module's doc for what is checked). `path` is expected to exist;
/// a missing file is reported as unreadable.
pub fn check_library(path: &Path) -> Result<(), Unfit> {
    let meta = std::fs::metadata(path).map_err(|e| Unfit::broken(format!("cannot be read: {e}")))?;
    if meta.is_dir() {
        return Err(Unfit::broken("is a directory"));
    }
    if !meta.is_file() {
        // A FIFO or device: reading it could block or never end, and it is no library.
        return Err(Unfit::broken("not a regular file"));
    }
    let file = File::open(path).map_err(|e| Unfit::broken(format!("cannot be read: {e}")))?;
    let size = file.metadata().map_err(|e| Unfit::broken(format!("cannot be read: {e}")))?.len();
    check_elf(&file, size, host())
}

/// The checks on an open file of `size` bytes, against `host`'s properties.
fn check_elf(file: &File, size: u64, host: Host) -> Result<(), Unfit> {
    let truncated = |what: String| Unfit::broken(format!("truncated: {what}"));
    let read = |at: u64, len: usize| -> Result<Vec<u8>, Unfit> {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, at).map_err(|e| Unfit::broken(format!("cannot be read: {e}")))?;
        Ok(buf)
    };
    if size == 0 {
        return Err(Unfit::broken("empty file"));
    }
    let ident = read(0, size.min(16) as usize)?;
    let magic_len = ident.len().min(4);
    if ident[..magic_len] != MAGIC[..magic_len] {
        return Err(Unfit::broken("not an ELF file (it does not begin with \\x7fELF)"));
    }
    if ident.len() < 16 {
        return Err(truncated(format!("{size} bytes, shorter than an ELF header")));
    }
    let (class, data) = (ident[4], ident[5]);
    if class != ELFCLASS32 && class != ELFCLASS64 {
        return Err(Unfit::broken(format!("invalid ELF class {class}")));
    }
    if data != ELFDATA2LSB && data != ELFDATA2MSB {
        return Err(Unfit::broken(format!("invalid ELF byte order {data}")));
    }
    if ident[6] != EV_CURRENT {
        return Err(Unfit::broken(format!("unknown ELF version {}", ident[6])));
    }
    if class != host.class {
        return Err(Unfit::foreign(format!("a {} library, this build is {}", class_name(class), class_name(host.class))));
    }
    if data != host.data {
        // Not passed over in a search: the loader fails on it, as here.
        return Err(Unfit::broken(format!("a {} library, this build is {}", data_name(data), data_name(host.data))));
    }
    let lay = layout(class);
    if size < lay.header as u64 {
        return Err(truncated(format!("{size} bytes, shorter than an ELF header ({} bytes)", lay.header)));
    }
    let header = read(0, lay.header)?;
    let h = Fields { bytes: &header, big: data == ELFDATA2MSB };
    let machine = h.u16(18);
    if let Some(want) = host.machine {
        if machine != want {
            return Err(Unfit::foreign(format!(
                "built for {} (e_machine {machine}), this build is {}",
                machine_name(machine),
                machine_name(want)
            )));
        }
    }
    let e_type = h.u16(16);
    if e_type != ET_DYN {
        let what = match e_type {
            0 => "none".to_string(),
            1 => "a relocatable object (ET_REL)".to_string(),
            2 => "an executable (ET_EXEC)".to_string(),
            4 => "a core dump (ET_CORE)".to_string(),
            t => format!("ELF type {t}"),
        };
        return Err(Unfit::broken(format!("not a shared library: {what}")));
    }
    let (phoff, phentsize, phnum) = if class == ELFCLASS64 {
        (h.u64(32), h.u16(54), h.u16(56))
    } else {
        (u64::from(h.u32(28)), h.u16(42), h.u16(44))
    };
    if phnum == 0 {
        return Err(Unfit::broken("no program headers"));
    }
    if usize::from(phentsize) != lay.phentsize {
        return Err(Unfit::broken(format!("program header entry size {phentsize}, expected {}", lay.phentsize)));
    }
    let table_len = usize::from(phnum) * lay.phentsize;
    let table_end = phoff.saturating_add(table_len as u64);
    if table_end > size {
        return Err(truncated(format!("the program headers end at byte {table_end} of a {size}-byte file")));
    }
    let table = read(phoff, table_len)?;
    let p = Fields { bytes: &table, big: data == ELFDATA2MSB };
    let mut loads = 0;
    for i in 0..usize::from(phnum) {
        let at = i * lay.phentsize;
        if p.u32(at) != PT_LOAD {
            continue;
        }
        loads += 1;
        let (offset, filesz) = if class == ELFCLASS64 {
            (p.word(at + 8, class), p.word(at + 32, class))
        } else {
            (p.word(at + 4, class), p.word(at + 16, class))
        };
        let end = offset.saturating_add(filesz);
        if end > size {
            // `i` counts program headers, as `readelf -l` numbers segments.
            return Err(truncated(format!("PT_LOAD segment {i} ends at byte {end} of a {size}-byte file")));
        }
    }
    if loads == 0 {
        return Err(Unfit::broken("no PT_LOAD segment"));
    }
    Ok(())
}

/// Files for the tests of this module and of [`super::library`].
#[cfg(test)]
pub(crate) mod test_files {
    use std::path::PathBuf;

    /// A shared library mapped into this test process (libc or another), from /proc/self/maps.
    pub fn real_library() -> PathBuf {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.starts_with('/') && (p.ends_with(".so") || p.contains(".so.")))
            .map(PathBuf::from)
            .expect("a shared library is mapped into the test process")
    }

    /// A temp directory for one test, removed on drop.
    pub struct Dir(pub PathBuf);

    impl Dir {
        pub fn new(test: &str) -> Dir {
            let dir = std::env::temp_dir().join(format!("rustccl-elf-check-{}-{test}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Dir(dir)
        }

        pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
            let path = self.0.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, bytes).unwrap();
            path
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_files::{real_library, Dir};
    use super::*;

    fn reason(path: &Path) -> String {
        check_library(path).expect_err("must be refused").reason
    }

    #[test]
    fn a_real_library_passes() {
        let lib = real_library();
        assert_eq!(check_library(&lib), Ok(()), "{}", lib.display());
    }

    #[test]
    fn truncated_copies_are_refused_at_every_length() {
        let dir = Dir::new("truncated");
        let bytes = std::fs::read(real_library()).unwrap();
        assert_eq!(reason(&dir.write("len0.so", &[])), "empty file");
        for len in [3, 10, 63] {
            let r = reason(&dir.write(&format!("len{len}.so"), &bytes[..len]));
            assert!(r.starts_with(&format!("truncated: {len} bytes, shorter than an ELF header")), "{len}: {r}");
        }
        let r = reason(&dir.write("len69.so", &bytes[..69]));
        assert!(r.starts_with("truncated: the program headers end at byte "), "{r}");
        assert!(r.ends_with(" of a 69-byte file"), "{r}");
        let r = reason(&dir.write("page.so", &bytes[..4096]));
        assert!(r.starts_with("truncated: PT_LOAD segment ") && r.ends_with(" of a 4096-byte file"), "{r}");
        let half = bytes.len() / 2;
        let r = reason(&dir.write("half.so", &bytes[..half]));
        assert!(r.starts_with("truncated: PT_LOAD segment "), "{r}");
        assert!(r.ends_with(&format!(" of a {half}-byte file")), "{r}");
        assert_eq!(check_library(&dir.write("full.so", &bytes)), Ok(()), "the untruncated copy passes");
    }

    #[test]
    fn another_machine_or_class_is_foreign_another_byte_order_refused() {
        let dir = Dir::new("foreign");
        let bytes = std::fs::read(real_library()).unwrap();
        let host = host();
        let big = host.data == ELFDATA2MSB;
        let other: u16 = if host.machine == Some(183) { 62 } else { 183 };
        let mut patched = bytes.clone();
        patched[18..20].copy_from_slice(&if big { other.to_be_bytes() } else { other.to_le_bytes() });
        let e = check_library(&dir.write("machine.so", &patched)).unwrap_err();
        assert!(e.foreign, "{e}");
        assert_eq!(
            e.reason,
            format!("built for {} (e_machine {other}), this build is {}", machine_name(other), std::env::consts::ARCH)
        );
        let mut patched = bytes.clone();
        let other_class = if host.class == ELFCLASS64 { ELFCLASS32 } else { ELFCLASS64 };
        patched[4] = other_class;
        let e = check_library(&dir.write("class.so", &patched)).unwrap_err();
        assert!(e.foreign, "{e}");
        assert_eq!(e.reason, format!("a {} library, this build is {}", class_name(other_class), class_name(host.class)));
        let mut patched = bytes;
        patched[5] = if big { ELFDATA2LSB } else { ELFDATA2MSB };
        let e = check_library(&dir.write("data.so", &patched)).unwrap_err();
        assert!(!e.foreign && e.reason.contains("-endian library, this build is"), "{e}");
    }

    #[test]
    fn other_files_are_refused_with_the_reason() {
        let dir = Dir::new("other");
        assert_eq!(reason(&dir.write("text.so", b"INPUT ( libfoo.so.1 )\n")), "not an ELF file (it does not begin with \\x7fELF)");
        assert_eq!(reason(&dir.0), "is a directory");
        assert!(reason(&dir.0.join("missing.so")).starts_with("cannot be read: "));
        assert_eq!(reason(Path::new("/dev/null")), "not a regular file");
        let mut exec = std::fs::read(real_library()).unwrap();
        let big = host().data == ELFDATA2MSB;
        exec[16..18].copy_from_slice(&if big { 2u16.to_be_bytes() } else { 2u16.to_le_bytes() });
        assert_eq!(reason(&dir.write("exec.so", &exec)), "not a shared library: an executable (ET_EXEC)");
        let e = check_library(&dir.write("hello.so", b"hello")).unwrap_err();
        assert!(!e.foreign, "{e}");
    }

    #[test]
    fn an_unknown_architecture_skips_only_the_machine_check() {
        let dir = Dir::new("unknown-arch");
        let mut bytes = std::fs::read(real_library()).unwrap();
        let big = host().data == ELFDATA2MSB;
        bytes[18..20].copy_from_slice(&if big { 9999u16.to_be_bytes() } else { 9999u16.to_le_bytes() });
        let path = dir.write("odd.so", &bytes);
        let file = File::open(&path).unwrap();
        let size = file.metadata().unwrap().len();
        assert_eq!(check_elf(&file, size, Host { machine: None, ..host() }), Ok(()));
        assert_eq!(check_elf(&file, size, host()).unwrap_err().reason, format!("built for machine 9999 (e_machine 9999), this build is {}", std::env::consts::ARCH));
    }
}
