//! Choosing a communicator's network plugin.
//!
//! Candidates, in NCCL's order ([`net_order`]): the libraries of
//! `NCCL_NET_PLUGIN` ([`discovery`](super::discovery)), then the IB transport's library when
//! present (on the loader's path or beside rustccl, [`net_order::ib_library_files`]), then the
//! built-in Socket plugin. For each library: open it and find its newest
//! supported table (rustccl's own, v2 then v1, then NCCL's C tables `ncclNetPlugin_v12` down
//! to `_v6`, adapted by [`super::c_net`]). Then, in order, each candidate whose name matches
//! `NCCL_NET` / `config.netName` (when one is asked for) gets `init` for this communicator and
//! must report a device. The first that passes is used; one INFO line says which, which ABI,
//! from where, and why; each candidate that failed gets one line saying why.

use std::sync::Arc;

use rustccl_plugin_api::export::{self, PluginKind};
use rustccl_plugin_api::net::{Net, NetCommConfig, NetV1, NetV1Client, NetV2, NetV2Client, NetV3, NetV3Client};
use rustccl_plugin_api::PluginHandle;

use super::c_net::{self, CNet};
use super::library::{self, OpenError, PluginLibrary};
use super::net_order::{self, Candidate};
use super::{Plugin, Skipped};
use crate::error::{Error, Result};

/// Net ABI versions this host understands, newest first.
pub const NET_ABI_VERSIONS: &[u32] = &[3, 2, 1];

/// A net plugin, built in or loaded.
pub type NetPlugin = Plugin<dyn Net>;

/// Which ABI a net plugin's table follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetAbi {
    /// rustccl's own (`rustccl_net_vN`).
    Rustccl(u32),
    /// NCCL's C table (`ncclNetPlugin_vN`).
    NcclC(u32),
}

impl std::fmt::Display for NetAbi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetAbi::Rustccl(v) => write!(f, "rustccl net ABI v{v}"),
            NetAbi::NcclC(v) => write!(f, "NCCL C net ABI v{v}"),
        }
    }
}

/// A net plugin read from a library, with the ABI of its table.
pub struct LoadedNet {
    pub plugin: NetPlugin,
    pub abi: NetAbi,
}

/// A net plugin initialised for one communicator; finalized when dropped.
#[derive(Debug)]
pub struct NetInstance {
    pub plugin: Arc<NetPlugin>,
    pub abi: NetAbi,
    pub ctx: PluginHandle,
    pub devices: i32,
}

impl Drop for NetInstance {
    fn drop(&mut self) {
        if let Err(e) = self.plugin.api.finalize(self.ctx) {
            tracing::warn!(target: "NET", "NET/{}: finalize failed: {}", self.plugin.name, e.message);
        }
    }
}

/// The built-in Socket plugin (one instance per process, like a loaded library's).
pub fn builtin_socket() -> NetPlugin {
    static SOCKET: std::sync::OnceLock<Arc<rustccl_net_socket::SocketNet>> = std::sync::OnceLock::new();
    let socket: Arc<dyn Net> = SOCKET.get_or_init(|| Arc::new(rustccl_net_socket::SocketNet::with_lookup(crate::params::env_str))).clone();
    Plugin::builtin(socket, "Socket", NET_ABI_VERSIONS[0])
}

/// Finds the newest net table a library exports: rustccl's, else NCCL's C tables newest first.
pub fn from_library(lib: &Arc<PluginLibrary>) -> std::result::Result<LoadedNet, String> {
    if let Some(t) = export::find::<NetV3>(&lib.lib, PluginKind::Net, 3)? {
        let plugin: NetPlugin = Plugin::loaded(Arc::new(NetV3Client { table: t }), t.base.base.name.as_str(), 3, lib);
        return Ok(LoadedNet { plugin, abi: NetAbi::Rustccl(3) });
    }
    if let Some(t) = export::find::<NetV2>(&lib.lib, PluginKind::Net, 2)? {
        let plugin: NetPlugin = Plugin::loaded(Arc::new(NetV2Client { table: t }), t.base.name.as_str(), 2, lib);
        return Ok(LoadedNet { plugin, abi: NetAbi::Rustccl(2) });
    }
    if let Some(t) = export::find::<NetV1>(&lib.lib, PluginKind::Net, 1)? {
        let plugin: NetPlugin = Plugin::loaded(Arc::new(NetV1Client { table: t }), t.name.as_str(), 1, lib);
        return Ok(LoadedNet { plugin, abi: NetAbi::Rustccl(1) });
    }
    note_collnet(lib);
    if let Some(c) = CNet::load(lib)? {
        let (name, v) = (c.name().to_string(), c.version());
        let plugin: NetPlugin = Plugin::loaded(Arc::new(c), &name, v, lib);
        return Ok(LoadedNet { plugin, abi: NetAbi::NcclC(v) });
    }
    let newer = library::nccl_c_symbols(lib, "ncclNetPlugin_v", c_net::NEWEST + 1..=c_net::NEWEST + 20);
    if !newer.is_empty() {
        return Err(format!(
            "it exports only {}, newer than the NCCL C net ABIs this rustccl knows (v{}..v{}); use a plugin build \
             that also exports an older table",
            newer.join(", "),
            c_net::OLDEST,
            c_net::NEWEST
        ));
    }
    Err(format!(
        "it exports no rustccl net plugin (symbols {}) nor an NCCL C net table (ncclNetPlugin_v{}..v{})",
        NET_ABI_VERSIONS.iter().map(|&v| export::symbol_name(PluginKind::Net, v)).collect::<Vec<_>>().join(", "),
        c_net::NEWEST,
        c_net::OLDEST
    ))
}

/// What a configured encryption key means for net plugin `plugin` (table `abi`): a plugin
/// that takes the key (rustccl net ABI v3, or the built-in Socket) encrypts its TCP traffic
/// with it. One that cannot is, as in NCCL 2.32 (which encrypts only the TCP traffic its own
/// socket code carries, "non-Socket transports remain outside that protection boundary"),
/// outside rustccl's encryption boundary: one INFO line per plugin and process says so. The
/// exception: a plugin named Socket that cannot take the key (rustccl's socket plugin from a
/// build before net ABI v3, or another TCP plugin by that name) would send the traffic the
/// user asked to encrypt in the clear, so it is refused (the next candidate, in the end the
/// built-in Socket, which encrypts, is tried).
fn encryption_boundary(plugin: &NetPlugin, abi: NetAbi, keyed: bool) -> std::result::Result<(), String> {
    if !keyed || plugin.api.takes_encryption_key() {
        return Ok(());
    }
    if plugin.name.eq_ignore_ascii_case("Socket") {
        return Err(format!(
            "an encryption key is configured (NCCL_ENCRYPTION_PSK or ncclSetEncryption) and this TCP plugin cannot take it              ({abi} has no encryption key at init; rustccl net ABI v3 does): its traffic would go unencrypted; use a              librustccl_net_socket.so built with net ABI v3, or leave NCCL_NET_PLUGIN unset for the built-in Socket"
        ));
    }
    static NOTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut noted = NOTED.lock().unwrap_or_else(|p| p.into_inner());
    let what = format!("{} ({})", plugin.name, plugin.origin);
    if !noted.contains(&what) {
        tracing::info!(
            target: "NET",
            "NET/Plugin: {what} ({abi}) cannot take the encryption key: its traffic is outside rustccl's encryption \
             boundary, as NCCL leaves non-Socket transports (the bootstrap stays encrypted)"
        );
        noted.push(what);
    }
    Ok(())
}

/// One INFO line per library (and process) that exports NCCL's CollNet, which rustccl does not
/// use; the library's net table still loads.
fn note_collnet(lib: &PluginLibrary) {
    static NOTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let collnet = library::nccl_c_symbols(lib, "ncclCollNetPlugin_v", 2..=c_net::NEWEST + 20);
    if collnet.is_empty() {
        return;
    }
    let mut noted = NOTED.lock().unwrap_or_else(|p| p.into_inner());
    if !noted.contains(&lib.path) {
        noted.push(lib.path.clone());
        tracing::info!(
            target: "NET",
            "NET/Plugin: {} also exports CollNet ({}); CollNet is not supported by rustccl, only its net table is used",
            lib.path,
            collnet.join(", ")
        );
    }
}

/// What the look for the IB transport's library found.
enum IbLookup {
    /// None of its files exists (the usual case without the IB plugin installed): the files
    /// tried.
    NotFound(Vec<String>),
    /// The library is already a candidate (`NCCL_NET_PLUGIN` named it).
    AlreadyListed,
    /// Its table, and how it was found (for the INFO line).
    Found(LoadedNet, String),
    /// There, but not loadable: the reason.
    Refused(Skipped),
}

/// Looks for the IB transport, which NCCL tries after the external plugins: the first of
/// [`net_order::ib_library_files`] that exists, beside rustccl's own file when the loader's
/// path has none.
fn find_ib_transport(listed: &[(NetPlugin, NetAbi, bool, String)]) -> IbLookup {
    let files = net_order::ib_library_files(library::rustccl_directory().as_deref());
    for file in &files {
        let lib = match library::open(file) {
            Ok(lib) => lib,
            Err(OpenError::NotFound) => continue,
            Err(OpenError::Failed(why)) => return IbLookup::Refused(Skipped { what: file.clone(), why, explicit: false }),
        };
        if listed.iter().any(|(p, ..)| p.library.as_ref().is_some_and(|l| l.path == lib.path)) {
            return IbLookup::AlreadyListed;
        }
        let how = if file.contains('/') { format!("beside rustccl: {file}") } else { file.clone() };
        return match from_library(&lib) {
            Ok(loaded) => IbLookup::Found(loaded, how),
            Err(why) => IbLookup::Refused(Skipped { what: lib.path.clone(), why, explicit: false }),
        };
    }
    IbLookup::NotFound(files)
}

/// Chooses and initialises the network for a communicator. `want` is `config.netName` or
/// `NCCL_NET` (already merged by the config).
pub fn select(comm_id: u64, want: Option<&str>, traffic_class: Option<i32>) -> Result<NetInstance> {
    let search = super::search(PluginKind::Net, None, from_library);
    let mut skipped = search.skipped;
    let mut not_found = search.not_found;
    let builtin_why = if search.disabled {
        "external plugins disabled (NCCL_NET_PLUGIN=none)"
    } else {
        "the built-in fallback"
    };
    let mut plugins: Vec<(NetPlugin, NetAbi, bool, String)> =
        search.found.into_iter().map(|f| (f.plugin.plugin, f.plugin.abi, f.explicit, f.why)).collect();
    let mut ib_at = None;
    match find_ib_transport(&plugins) {
        IbLookup::Found(ib, how) => {
            let why = format!("the IB transport ({how}), tried after external plugins and before Socket");
            plugins.push((ib.plugin, ib.abi, false, why));
            ib_at = Some(plugins.len() - 1);
        }
        IbLookup::NotFound(files) => not_found.extend(files),
        IbLookup::AlreadyListed => {}
        IbLookup::Refused(s) => skipped.push(s),
    }
    plugins.push((builtin_socket(), NetAbi::Rustccl(NET_ABI_VERSIONS[0]), false, builtin_why.to_string()));

    let config = NetCommConfig { traffic_class: traffic_class.unwrap_or(-1) };
    let key = rustccl_securewire::process_key();
    let candidates: Vec<Candidate> =
        plugins.iter().map(|(p, ..)| Candidate { name: p.name.clone(), origin: p.origin.clone() }).collect();
    let mut ctx = None;
    let choice = net_order::choose(&candidates, want, |i| {
        let api = &plugins[i].0.api;
        let mut probe = || {
            encryption_boundary(&plugins[i].0, plugins[i].1, key.is_some())?;
            let c = api
                .init_with_key(comm_id, &config, key.as_deref().map(|k| k.expose_secret()), super::logger())
                .map_err(|e| format!("init failed: {}", e.message))?;
            match api.devices(c) {
                Ok(n) if n > 0 => {
                    ctx = Some(c);
                    Ok(n)
                }
                other => {
                    let _ = api.finalize(c);
                    other.map_err(|e| format!("listing devices failed: {}", e.message))
                }
            }
        };
        // The IB transport nobody asked for: without RDMA it fails, which is no warning.
        if ib_at == Some(i) && want.is_none() {
            super::probe_quietly(probe, |r| matches!(r, Ok(n) if *n > 0))
        } else {
            probe()
        }
    });
    for (i, why) in &choice.skipped {
        let named_otherwise = want.is_some_and(|w| !candidates[*i].name.eq_ignore_ascii_case(w));
        skipped.push(Skipped { what: candidates[*i].describe(), why: why.clone(), explicit: plugins[*i].2 && !named_otherwise });
    }
    super::log_skipped(PluginKind::Net, &not_found, &skipped);
    let (Some((index, devices)), Some(ctx)) = (choice.chosen, ctx) else {
        return Err(Error::invalid_usage(net_order::failure_message(&candidates, want, &choice)));
    };
    let (plugin, abi, _, why) = plugins.swap_remove(index);
    let inst = NetInstance { plugin: Arc::new(plugin), abi, ctx, devices };
    tracing::info!(
        target: "NET",
        "NET/Plugin: using {} ({}) from {}, {} device(s): {why}",
        inst.plugin.name, inst.abi, inst.plugin.origin, inst.devices
    );
    Ok(inst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustccl_plugin_api::net::NetProvider;

    /// The socket plugin behind tables of each version, under the names asked for.
    struct SocketBehind;
    impl NetProvider for SocketBehind {
        fn get() -> &'static dyn Net {
            rustccl_net_socket::instance()
        }
    }
    static SOCKET_V2: NetV2 = NetV2::table::<SocketBehind>("Socket");
    static OTHER_V2: NetV2 = NetV2::table::<SocketBehind>("OtherTcp");
    static SOCKET_V3: NetV3 = NetV3::table::<SocketBehind>("Socket");

    fn plugin(api: Arc<dyn Net>, name: &str, v: u32) -> (NetPlugin, NetAbi) {
        (Plugin::builtin(api, name, v), NetAbi::Rustccl(v))
    }

    /// With a key: a plugin that takes it passes; a Socket plugin that cannot is refused
    /// with the reason; any other plugin that cannot passes (outside the boundary, said at
    /// INFO). Without a key every plugin passes.
    #[test]
    fn the_encryption_boundary_refuses_only_a_socket_plugin_without_the_key() {
        let (v3, a3) = plugin(Arc::new(NetV3Client { table: &SOCKET_V3 }), "Socket", 3);
        let (v2, a2) = plugin(Arc::new(NetV2Client { table: &SOCKET_V2 }), "Socket", 2);
        let (other, ao) = plugin(Arc::new(NetV2Client { table: &OTHER_V2 }), "OtherTcp", 2);
        assert!(encryption_boundary(&v3, a3, true).is_ok());
        let why = encryption_boundary(&v2, a2, true).unwrap_err();
        assert!(why.contains("cannot take it") && why.contains("rustccl net ABI v2") && why.contains("v3"), "{why}");
        assert!(encryption_boundary(&other, ao, true).is_ok(), "outside the boundary, as NCCL");
        for (p, a) in [(&v3, a3), (&v2, a2), (&other, ao)] {
            assert!(encryption_boundary(p, a, false).is_ok());
        }
        assert!(builtin_socket().api.takes_encryption_key());
    }
}
