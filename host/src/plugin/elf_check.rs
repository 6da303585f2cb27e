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
//! The `object` crate reads the headers, through its [`ReadCache`]: plain reads of just the
//! bytes asked for, against the file's real size (a memory map of a truncated file is what
//! faults). What is left here is which failure to report, in words.

use std::fs::File;
use std::path::Path;

use object::elf::{self, ELFCLASS32, ELFCLASS64, ELFDATA2LSB, ELFDATA2MSB};
use object::read::elf::{ElfFile, FileHeader, ProgramHeader};
use object::{Architecture, Endianness, Object, ReadCache, ReadRef};

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

/// The ELF header of this build's class: the only class read past the identification bytes.
#[cfg(target_pointer_width = "64")]
type Header = elf::FileHeader64<Endianness>;
#[cfg(target_pointer_width = "32")]
type Header = elf::FileHeader32<Endianness>;

/// `object`'s architectures and the names Rust gives them (`std::env::consts::ARCH`).
const ARCHITECTURES: &[(Architecture, &str)] = &[
    (Architecture::I386, "x86"),
    (Architecture::X86_64, "x86_64"),
    (Architecture::Arm, "arm"),
    (Architecture::Aarch64, "aarch64"),
    (Architecture::Mips, "mips"),
    (Architecture::Mips64, "mips64"),
    (Architecture::PowerPc, "powerpc"),
    (Architecture::PowerPc64, "powerpc64"),
    (Architecture::S390x, "s390x"),
    (Architecture::Sparc64, "sparc64"),
    (Architecture::Riscv32, "riscv32"),
    (Architecture::Riscv64, "riscv64"),
    (Architecture::LoongArch64, "loongarch64"),
];

/// The ELF file properties this build loads.
#[derive(Clone, Copy, Debug)]
struct Host {
    class: elf::FileClass,
    data: elf::DataEncoding,
    /// `None` on an architecture missing from [`ARCHITECTURES`]: the machine is then not checked.
    machine: Option<Architecture>,
}

fn host() -> Host {
    let arch = std::env::consts::ARCH;
    Host {
        class: if cfg!(target_pointer_width = "64") { ELFCLASS64 } else { ELFCLASS32 },
        data: if cfg!(target_endian = "little") { ELFDATA2LSB } else { ELFDATA2MSB },
        machine: ARCHITECTURES.iter().find(|(_, name)| *name == arch).map(|(a, _)| *a),
    }
}

fn class_name(class: elf::FileClass) -> &'static str {
    if class == ELFCLASS64 {
        "64-bit"
    } else {
        "32-bit"
    }
}

fn data_name(data: elf::DataEncoding) -> &'static str {
    if data == ELFDATA2LSB {
        "little-endian"
    } else {
        "big-endian"
    }
}

/// Rust's name for `arch`, or the raw `e_machine` value for one without a name here.
fn machine_name(arch: Architecture, e_machine: elf::Machine) -> String {
    match ARCHITECTURES.iter().find(|(a, _)| *a == arch) {
        Some((_, name)) => name.to_string(),
        None => format!("machine {e_machine}"),
    }
}

/// `object`'s architecture for an ELF header (from `e_machine`, the class and, for MIPS, the
/// flags). `object` gives it only for a whole parsed file ([`ElfFile`]), and parsing one also
/// reads the section headers, which the dynamic loader never reads (a file whose section
/// headers are cut off still loads). So the header is parsed alone, its table offsets cleared.
fn architecture(header: &Header) -> Architecture {
    let mut alone = *header;
    alone.e_phoff = Default::default();
    alone.e_shoff = Default::default();
    ElfFile::<Header>::parse(object::bytes_of(&alone)).map_or(Architecture::Unknown, |f| f.architecture())
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
    // `ReadCache` keeps no I/O error; a read of bytes inside the file fails only on one.
    let read_failed = || Unfit::broken("cannot be read: a read inside the file failed");
    if size == 0 {
        return Err(Unfit::broken("empty file"));
    }
    let data = &ReadCache::new(file);
    let start = data.read_bytes_at(0, size.min(16)).map_err(|()| read_failed())?;
    if !elf::ELFMAG.starts_with(&start[..start.len().min(4)]) {
        return Err(Unfit::broken("not an ELF file (it does not begin with \\x7fELF)"));
    }
    if start.len() < 16 {
        return Err(truncated(format!("{size} bytes, shorter than an ELF header")));
    }
    // The identification bytes (`e_ident`) decide the header's size and byte order, so they
    // are looked at alone first; `object` reads them only as part of a whole header.
    let (class, data_order, version) = (elf::FileClass(start[4]), elf::DataEncoding(start[5]), elf::FileVersion(start[6]));
    if class != ELFCLASS32 && class != ELFCLASS64 {
        return Err(Unfit::broken(format!("invalid ELF class {class}")));
    }
    if data_order != ELFDATA2LSB && data_order != ELFDATA2MSB {
        return Err(Unfit::broken(format!("invalid ELF byte order {data_order}")));
    }
    if version != elf::EV_CURRENT {
        return Err(Unfit::broken(format!("unknown ELF version {version}")));
    }
    if class != host.class {
        return Err(Unfit::foreign(format!("a {} library, this build is {}", class_name(class), class_name(host.class))));
    }
    if data_order != host.data {
        // Not passed over in a search: the loader fails on it, as here.
        return Err(Unfit::broken(format!("a {} library, this build is {}", data_name(data_order), data_name(host.data))));
    }
    let header_len = size_of::<Header>();
    if size < header_len as u64 {
        return Err(truncated(format!("{size} bytes, shorter than an ELF header ({header_len} bytes)")));
    }
    let header = Header::parse(data).map_err(|_| read_failed())?;
    let endian = if data_order == ELFDATA2MSB { Endianness::Big } else { Endianness::Little };
    let e_machine = header.e_machine(endian);
    if let Some(want) = host.machine {
        let arch = architecture(header);
        if arch != want {
            return Err(Unfit::foreign(format!(
                "built for {} (e_machine {e_machine}), this build is {}",
                machine_name(arch, e_machine),
                std::env::consts::ARCH
            )));
        }
    }
    let e_type = header.e_type(endian);
    if e_type != elf::ET_DYN {
        let what = match e_type {
            elf::ET_NONE => "none".to_string(),
            elf::ET_REL => "a relocatable object (ET_REL)".to_string(),
            elf::ET_EXEC => "an executable (ET_EXEC)".to_string(),
            elf::ET_CORE => "a core dump (ET_CORE)".to_string(),
            t => format!("ELF type {t}"),
        };
        return Err(Unfit::broken(format!("not a shared library: {what}")));
    }
    let segments = header.program_headers(endian, data).map_err(|_| {
        // `object` refuses a table of another entry size, or one that is not inside the file.
        let (phentsize, want) = (header.e_phentsize(endian), size_of::<<Header as FileHeader>::ProgramHeader>());
        if usize::from(phentsize) != want {
            return Unfit::broken(format!("program header entry size {phentsize}, expected {want}"));
        }
        #[allow(clippy::useless_conversion)] // `e_phoff` is a `u32` in 32-bit builds.
        let phoff: u64 = header.e_phoff(endian).into();
        let table_end = phoff.saturating_add(u64::from(header.e_phnum(endian)) * want as u64);
        if table_end > size {
            return truncated(format!("the program headers end at byte {table_end} of a {size}-byte file"));
        }
        read_failed()
    })?;
    if segments.is_empty() {
        return Err(Unfit::broken("no program headers"));
    }
    let mut loads = 0;
    for (i, segment) in segments.iter().enumerate() {
        if segment.p_type(endian) != elf::PT_LOAD {
            continue;
        }
        loads += 1;
        let (offset, filesz) = segment.file_range(endian);
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
        let (other, other_name): (u16, _) = if host.machine == Some(Architecture::Aarch64) { (62, "x86_64") } else { (183, "aarch64") };
        let mut patched = bytes.clone();
        patched[18..20].copy_from_slice(&if big { other.to_be_bytes() } else { other.to_le_bytes() });
        let e = check_library(&dir.write("machine.so", &patched)).unwrap_err();
        assert!(e.foreign, "{e}");
        assert_eq!(
            e.reason,
            format!("built for {other_name} (e_machine {other}), this build is {}", std::env::consts::ARCH)
        );
        let mut patched = bytes.clone();
        let other_class = if host.class == ELFCLASS64 { ELFCLASS32 } else { ELFCLASS64 };
        patched[4] = other_class.0;
        let e = check_library(&dir.write("class.so", &patched)).unwrap_err();
        assert!(e.foreign, "{e}");
        assert_eq!(e.reason, format!("a {} library, this build is {}", class_name(other_class), class_name(host.class)));
        let mut patched = bytes;
        patched[5] = if big { ELFDATA2LSB.0 } else { ELFDATA2MSB.0 };
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
