//! How a plugin library exports its plugins, and how the host finds them.
//!
//! Like NCCL, a library exports one symbol per plugin kind and ABI version it implements,
//! named `rustccl_<kind>_v<N>` (`rustccl_net_v1`, `rustccl_tuner_v2`, ...), so one `.so` may
//! carry a net, a tuner and a profiler, each in several versions. The host looks for the
//! newest version it knows first, then older ones, and adapts an older table to the current
//! interface. Each symbol is a [`PluginExport`]: a magic number, the abi_stable
//! [`TypeLayout`] of the table as the plugin was compiled, and the table. Before the host
//! touches the table it checks, with abi_stable's layout checker, that the plugin's layout is
//! the one the host expects for that version, so a plugin built against a changed table is
//! refused with a message instead of crashing.

use abi_stable::abi_stability::abi_checking::check_layout_compatibility;
use abi_stable::type_layout::TypeLayout;
use abi_stable::StableAbi;

/// `b"RCCLPLUG"` as a little-endian u64.
pub const EXPORT_MAGIC: u64 = u64::from_le_bytes(*b"RCCLPLUG");

/// The kinds of plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PluginKind {
    Net,
    Tuner,
    Profiler,
    Env,
}

impl PluginKind {
    /// Lower-case name used in symbols and file names.
    pub fn name(self) -> &'static str {
        match self {
            PluginKind::Net => "net",
            PluginKind::Tuner => "tuner",
            PluginKind::Profiler => "profiler",
            PluginKind::Env => "env",
        }
    }

    /// NCCL's environment variable that names this kind's plugin.
    pub fn env_var(self) -> &'static str {
        match self {
            PluginKind::Net => "NCCL_NET_PLUGIN",
            PluginKind::Tuner => "NCCL_TUNER_PLUGIN",
            PluginKind::Profiler => "NCCL_PROFILER_PLUGIN",
            PluginKind::Env => "NCCL_ENV_PLUGIN",
        }
    }
}

/// The symbol a library exports for `kind` at ABI `version`.
pub fn symbol_name(kind: PluginKind, version: u32) -> String {
    format!("rustccl_{}_v{version}", kind.name())
}

/// What a plugin library exports under [`symbol_name`].
#[repr(C)]
pub struct PluginExport<T: 'static> {
    pub magic: u64,
    /// Layout of `T` as the plugin was compiled.
    pub layout: &'static TypeLayout,
    pub table: &'static T,
}

// SAFETY: the export is immutable static data; `T` tables hold only function pointers and
// 'static strings.
unsafe impl<T: Sync> Sync for PluginExport<T> {}

impl<T: StableAbi + 'static> PluginExport<T> {
    /// The export of `table` (used by the `export_*` macros).
    pub const fn new(table: &'static T) -> PluginExport<T> {
        PluginExport { magic: EXPORT_MAGIC, layout: <T as StableAbi>::LAYOUT, table }
    }
}

/// Looks up `kind` at `version` in `lib`. `Ok(None)`: the library does not export it.
/// `Err`: it does, but the export is damaged or its layout differs from what this host expects.
///
/// The table is the library's static data: it stays valid while `lib` stays loaded, which the
/// caller ensures by keeping the library open as long as it uses the table.
pub fn find<T: StableAbi + 'static>(
    lib: &libloading::Library,
    kind: PluginKind,
    version: u32,
) -> Result<Option<&'static T>, String> {
    let name = symbol_name(kind, version);
    // SAFETY: the symbol, if present, is a `PluginExport<T>` static by the naming contract;
    // its magic and layout are checked below before the table is used.
    // The library stays loaded while the table is used (see above), so the export may be
    // treated as 'static data.
    let export: &'static PluginExport<T> = unsafe {
        match lib.get::<*const PluginExport<T>>(name.as_bytes()) {
            Ok(sym) => match (*sym).as_ref() {
                Some(e) => e,
                None => return Err(format!("symbol {name} is null")),
            },
            Err(_) => return Ok(None),
        }
    };
    if export.magic != EXPORT_MAGIC {
        return Err(format!("symbol {name} is not a rustccl plugin export (bad magic)"));
    }
    check_layout_compatibility(<T as StableAbi>::LAYOUT, export.layout).map_err(|e| {
        format!("{name} does not match this rustccl's {} v{version} ABI (rebuild the plugin): {e}", kind.name())
            .replace('\n', " ")
    })?;
    Ok(Some(export.table))
}
