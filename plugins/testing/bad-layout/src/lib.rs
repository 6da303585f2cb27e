//! Exists for loader tests: exports a symbol named `rustccl_net_v1` with a valid magic number
//! whose table (and recorded layout) is a different struct from the real `NetV1` — same
//! name, wrong fields — so the loader's abi_stable layout check must refuse it with a
//! message instead of calling into it.

use abi_stable::std_types::RStr;
use abi_stable::StableAbi;
use rustccl_plugin_api::export::PluginExport;

/// Not the real net table: named like it, but with other fields.
#[repr(C)]
#[derive(StableAbi)]
pub struct NetV1 {
    pub name: RStr<'static>,
    pub init: extern "C" fn(flags: u32) -> u32,
    pub extra: u64,
}

extern "C" fn init(flags: u32) -> u32 {
    flags
}

static TABLE: NetV1 = NetV1 { name: RStr::from_str("WrongLayout"), init, extra: 7 };

/// The export, built as any export is (magic and the layout of the table it carries), under
/// the net symbol.
#[no_mangle]
#[used]
#[allow(non_upper_case_globals)]
pub static rustccl_net_v1: PluginExport<NetV1> = PluginExport::new(&TABLE);
