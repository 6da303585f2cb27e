//! Exists for loader tests: a net plugin named `Broken` whose `init` always fails with
//! `PluginError::system("test plugin: init fails on purpose")`, so the host must skip it and
//! fall back to the next candidate. Its other functions return errors too.

use rustccl_plugin_api::net::{Net, NetCommConfig, NetHandle, NetProperties, RecvBuffer};
use rustccl_plugin_api::{LogFn, PluginError, PluginHandle};

/// The message of `init`'s error.
pub const INIT_ERROR: &str = "test plugin: init fails on purpose";

/// The broken network.
pub struct Broken;

fn nope<T>() -> Result<T, PluginError> {
    Err(PluginError::internal("test plugin Broken: not initialised"))
}

impl Net for Broken {
    fn init(&self, _comm_id: u64, _config: &NetCommConfig, _log: LogFn) -> Result<PluginHandle, PluginError> {
        Err(PluginError::system(INIT_ERROR))
    }
    fn devices(&self, _ctx: PluginHandle) -> Result<i32, PluginError> {
        nope()
    }
    fn properties(&self, _ctx: PluginHandle, _dev: i32) -> Result<NetProperties, PluginError> {
        nope()
    }
    fn listen(&self, _ctx: PluginHandle, _dev: i32) -> Result<(NetHandle, PluginHandle), PluginError> {
        nope()
    }
    fn connect(&self, _ctx: PluginHandle, _dev: i32, _handle: &NetHandle) -> Result<Option<PluginHandle>, PluginError> {
        nope()
    }
    fn accept(&self, _listen: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
        nope()
    }
    fn reg_mr(&self, _comm: PluginHandle, _data: usize, _size: usize, _ptr_type: u32) -> Result<PluginHandle, PluginError> {
        nope()
    }
    fn dereg_mr(&self, _comm: PluginHandle, _mr: PluginHandle) -> Result<(), PluginError> {
        nope()
    }
    unsafe fn isend(
        &self,
        _comm: PluginHandle,
        _data: usize,
        _size: usize,
        _tag: i32,
        _mr: PluginHandle,
    ) -> Result<Option<PluginHandle>, PluginError> {
        nope()
    }
    unsafe fn irecv(&self, _comm: PluginHandle, _bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
        nope()
    }
    fn iflush(&self, _comm: PluginHandle, _bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
        nope()
    }
    fn test(&self, _request: PluginHandle, _sizes: &mut [usize]) -> Result<bool, PluginError> {
        nope()
    }
    fn close_send(&self, _comm: PluginHandle) -> Result<(), PluginError> {
        nope()
    }
    fn close_recv(&self, _comm: PluginHandle) -> Result<(), PluginError> {
        nope()
    }
    fn close_listen(&self, _listen: PluginHandle) -> Result<(), PluginError> {
        nope()
    }
    fn finalize(&self, _ctx: PluginHandle) -> Result<(), PluginError> {
        nope()
    }
}

rustccl_plugin_api::export_net_v1!("Broken", Broken, Broken);
