//! The CUDA backend on a real GPU: every trait method but `launch_exec` (which the
//! collective tests drive, through `coll/device.rs`), on every visible device.
//!
//! Without a CUDA driver (CI) the test is SKIPPED, with the reason printed, after checking
//! that asking for the CUDA backend is a clear error and not a panic. On the GPU machine it
//! runs for real:
//! - alloc/copy round trips, memset, offsets, bad ranges and frees refused;
//! - streams and events: ordering across two streams through an event, queries, a caller's
//!   own `CUstream` (what a `cudaStream_t` is), the default stream with and without a current
//!   context, and the caller's current context left as it was;
//! - host-mapped and registered host memory read and written by copies and fills;
//! - a copy between two devices' memory (with two devices or more);
//! - CUDA IPC between two processes: this test binary runs itself as the child
//!   (`RUSTCCL_CUDA_TEST_CHILD=ipc`), which imports the parent's memory, reads it, copies
//!   into it and exits; the parent sees the child's writes;
//! - the kernel cache: the first compile of the collective kernels in a fresh cache directory
//!   (one cache file per kernel), then a second process (`RUSTCCL_CUDA_TEST_CHILD=cache`) that
//!   must find them in the cache (its log says "kernel cache hit") and load them without
//!   compiling.
//!
//! It prints one summary line: `cuda_backend: N passed, M failed`.

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys;
use rustccl::backend::{backend_from_name, CudaBackend, DeviceBackend, DevicePtr, Memory, ShareHandle, Sharing, Stream, Streams};
use rustccl::ResultCode;

const CHILD_ENV: &str = "RUSTCCL_CUDA_TEST_CHILD";
const HANDLE_ENV: &str = "RUSTCCL_CUDA_TEST_HANDLE";
const DEVICE_ENV: &str = "RUSTCCL_CUDA_TEST_DEVICE";
const S: Stream = Stream::DEFAULT;

/// Counts checks; failures are collected (the first few printed) rather than stopping.
#[derive(Default)]
struct Tally {
    passed: usize,
    failed: Vec<String>,
}
impl Tally {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if ok {
            self.passed += 1;
        } else {
            let w = what();
            if self.failed.len() < 20 {
                eprintln!("FAILED: {w}");
            }
            self.failed.push(w);
        }
    }
}

/// Prints past the test harness's capture (it only captures the print macros), so the skip
/// reason and the summary show in a plain `cargo test`.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The backend, or None (and the printed reason) when there is no CUDA driver or device.
fn backend_or_skip() -> Option<Arc<CudaBackend>> {
    match CudaBackend::shared() {
        Ok(b) => Some(b),
        Err(e) => {
            let no_driver = e.message.contains("no CUDA driver") || e.message.contains("CUDA_ERROR_NO_DEVICE");
            assert!(no_driver, "the CUDA backend failed on a machine with a driver: {e}");
            assert_eq!(e.code, ResultCode::UnhandledCudaError);
            // Asking by name is the same clear error, never a panic.
            let by_name = backend_from_name(Some("cuda")).unwrap_err();
            assert_eq!(by_name.message, e.message);
            say(&format!("cuda_backend: SKIPPED: {}", e.message));
            None
        }
    }
}

fn upload(b: &CudaBackend, device: usize, data: &[u8]) -> DevicePtr {
    let p = b.alloc(device, data.len().max(1)).unwrap();
    b.copy_to_device(p, data, S).unwrap();
    p
}

fn download(b: &CudaBackend, p: DevicePtr, bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes];
    b.copy_from_device(&mut out, p, S).unwrap();
    out
}

fn current_ctx() -> sys::CUcontext {
    let mut c: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver is loaded (the backend started); writes one handle.
    assert_eq!(unsafe { sys::cuCtxGetCurrent(&mut c) }, sys::CUresult::CUDA_SUCCESS);
    c
}

fn set_ctx(c: sys::CUcontext) {
    // SAFETY: a live context or null.
    assert_eq!(unsafe { sys::cuCtxSetCurrent(c) }, sys::CUresult::CUDA_SUCCESS);
}

// ---- basic memory, streams, events ------------------------------------------------------

fn memory_and_copies(b: &CudaBackend, d: usize, t: &mut Tally) {
    let n = 1 << 20;
    let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    let a = upload(b, d, &data);
    let c = b.alloc(d, n).unwrap();
    b.copy(c, a, n, S).unwrap();
    t.check(download(b, c, n) == data, || format!("dev {d}: device-to-device round trip"));
    b.copy(c.offset(10), a.offset(500), 20, S).unwrap();
    t.check(download(b, c.offset(10), 20) == data[500..520], || format!("dev {d}: copy at offsets"));
    b.memset(c, 0xEE, 5, S).unwrap();
    t.check(download(b, c, 6) == [0xEE, 0xEE, 0xEE, 0xEE, 0xEE, data[5]], || format!("dev {d}: memset"));
    // Bad ranges and frees are InvalidArgument, not faults.
    let e = b.copy(c, a, n + 1, S).unwrap_err();
    t.check(e.code == ResultCode::InvalidArgument, || format!("dev {d}: copy past the end gave {e}"));
    let e = b.memset(DevicePtr(0x10), 0, 4, S).unwrap_err();
    t.check(e.code == ResultCode::InvalidArgument, || format!("dev {d}: memset of a wild pointer gave {e}"));
    b.free(a).unwrap();
    let e = b.free(a).unwrap_err();
    t.check(e.code == ResultCode::InvalidArgument, || format!("dev {d}: double free gave {e}"));
    t.check(b.host_access().is_none(), || "host_access: device memory is not host-addressable".into());
    t.check(b.alloc(d, 0).is_err(), || "alloc of 0 bytes".into());
    b.free(c).unwrap();
}

fn streams_and_events(b: &CudaBackend, d: usize, t: &mut Tally) {
    let big = 256 << 20;
    let s1 = b.create_stream(d).unwrap();
    let s2 = b.create_stream(d).unwrap();
    let a = b.alloc(d, big).unwrap();
    let c = b.alloc(d, big).unwrap();
    let out = b.alloc(d, 4096).unwrap();
    b.memset(c, 0, big, s1).unwrap();
    b.synchronize(s1).unwrap();
    let e = b.create_event(d).unwrap();
    t.check(b.query_event(e).unwrap(), || "a new event is complete".into());
    // s1: fill a, copy it to c (milliseconds of work), record e. s2: wait for e, read c's end.
    b.memset(a, 7, big, s1).unwrap();
    b.copy(c, a, big, s1).unwrap();
    b.record_event(e, s1).unwrap();
    b.stream_wait_event(s2, e).unwrap();
    b.copy(out, c.offset(big - 4096), 4096, s2).unwrap();
    b.synchronize(s2).unwrap();
    t.check(download(b, out, 4096).iter().all(|&v| v == 7), || format!("dev {d}: event ordering across streams"));
    b.synchronize_event(e).unwrap();
    t.check(b.query_event(e).unwrap() && b.query(s1).unwrap() && b.query(s2).unwrap(), || "queries after sync".into());
    // A query while work runs is false or true, never an error.
    b.memset(a, 1, big, s1).unwrap();
    b.copy(c, a, big, s1).unwrap();
    let busy = b.query(s1).unwrap();
    b.synchronize(s1).unwrap();
    t.check(b.query(s1).unwrap(), || format!("dev {d}: query after sync (was {busy})"));
    b.destroy_event(e).unwrap();
    t.check(b.destroy_event(e).unwrap_err().code == ResultCode::InvalidArgument, || "double destroy_event".into());
    b.destroy_stream(s1).unwrap();
    b.destroy_stream(s2).unwrap();
    t.check(b.destroy_stream(s1).unwrap_err().code == ResultCode::InvalidArgument, || "double destroy_stream".into());
    t.check(b.destroy_stream(Stream::DEFAULT).is_err(), || "destroying the default stream".into());

    // A caller's own stream (a cudaStream_t is a CUstream) in the caller's current context.
    let before = current_ctx();
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    let mut dev: sys::CUdevice = 0;
    // SAFETY: plain driver calls with out-parameters.
    unsafe {
        assert_eq!(sys::cuDeviceGet(&mut dev, d as i32), sys::CUresult::CUDA_SUCCESS);
        assert_eq!(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), sys::CUresult::CUDA_SUCCESS);
    }
    set_ctx(ctx);
    let mut raw: sys::CUstream = std::ptr::null_mut();
    // SAFETY: writes one handle; blocking stream, like cudaStreamCreate's default.
    assert_eq!(unsafe { sys::cuStreamCreate(&mut raw, 0) }, sys::CUresult::CUDA_SUCCESS);
    let user = Stream::from_raw(raw as u64);
    b.memset(out, 0x42, 4096, user).unwrap();
    b.copy(a, out, 4096, user).unwrap();
    b.synchronize(user).unwrap();
    t.check(download(b, a, 4096).iter().all(|&v| v == 0x42), || format!("dev {d}: caller's CUstream"));
    // The default stream in the caller's current context.
    b.memset(out, 0x43, 4096, Stream::DEFAULT).unwrap();
    b.synchronize(Stream::DEFAULT).unwrap();
    t.check(download(b, out, 4096).iter().all(|&v| v == 0x43), || format!("dev {d}: default stream"));
    t.check(current_ctx() == ctx, || format!("dev {d}: the caller's current context is kept"));
    // SAFETY: our stream, idle.
    unsafe { sys::cuStreamDestroy_v2(raw) };
    // No current context: the default stream runs where the memory is, and none is left set.
    set_ctx(std::ptr::null_mut());
    b.memset(out, 0x44, 4096, Stream::DEFAULT).unwrap();
    t.check(download(b, out, 4096).iter().all(|&v| v == 0x44), || format!("dev {d}: default stream, no context"));
    t.check(current_ctx().is_null(), || format!("dev {d}: no context left current"));
    set_ctx(before);
    // SAFETY: releases the reference taken above.
    unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
    for p in [a, c, out] {
        b.free(p).unwrap();
    }
}

fn host_memory(b: &CudaBackend, d: usize, t: &mut Tally) {
    let n = 4096;
    let m = b.alloc_host_mapped(n).unwrap();
    // SAFETY: `m.host` points to n bytes nothing else uses now.
    let host = unsafe { std::slice::from_raw_parts_mut(m.host, n) };
    for (i, v) in host.iter_mut().enumerate() {
        *v = (i % 100) as u8;
    }
    // A copy reads host-mapped memory; a copy and a fill write it.
    let dst = b.alloc(d, n).unwrap();
    b.copy(dst, m.device, n, S).unwrap();
    b.copy(m.device.offset(n / 2), dst, n / 2, S).unwrap();
    b.memset(m.device, 0xAB, 16, S).unwrap();
    b.synchronize(S).unwrap();
    let want: Vec<u8> = (0..n)
        .map(|i| {
            if i < 16 {
                0xAB
            } else if i < n / 2 {
                (i % 100) as u8
            } else {
                ((i - n / 2) % 100) as u8
            }
        })
        .collect();
    t.check(host == want.as_slice(), || format!("dev {d}: host-mapped memory through copies and a fill"));
    t.check(b.free(m.device).is_err(), || "free of host-mapped memory is refused".into());
    b.free_host_mapped(m).unwrap();

    let mut user = vec![1u8; 1000];
    // SAFETY: `user` outlives the registration.
    let p = unsafe { b.register_host(user.as_mut_ptr(), 1000) }.unwrap();
    b.memset(p.offset(8), 3, 8, S).unwrap();
    b.copy(dst, p, 1000, S).unwrap();
    b.synchronize(S).unwrap();
    b.unregister_host(p).unwrap();
    t.check(user[7..17] == [1, 3, 3, 3, 3, 3, 3, 3, 3, 1], || format!("dev {d}: registered host memory"));
    t.check(download(b, dst, 1000) == user, || format!("dev {d}: copy from registered memory"));
    b.free(dst).unwrap();
}

/// A copy on device 0's stream from device 1's memory into device 0's.
fn cross_device(b: &CudaBackend, t: &mut Tally) {
    let x = upload(b, 1, &[3u8; 256]);
    let y = upload(b, 0, &[4u8; 256]);
    let s = b.create_stream(0).unwrap();
    b.copy(y.offset(64), x, 128, s).unwrap();
    b.synchronize(s).unwrap();
    let want: Vec<u8> = (0..256).map(|i| if (64..192).contains(&i) { 3 } else { 4 }).collect();
    t.check(download(b, y, 256) == want, || "copy across devices".into());
    b.destroy_stream(s).unwrap();
    b.free(x).unwrap();
    b.free(y).unwrap();
}

// ---- two processes --------------------------------------------------------------------------

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn run_child(role: &str, envs: &[(&str, String)]) -> (bool, String) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child_process", "--nocapture", "--test-threads=1"]).env(CHILD_ENV, role);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn ipc_between_processes(b: &CudaBackend, t: &mut Tally) {
    let half = 1 << 19;
    let (p, handle) = b.alloc_shareable(0, 2 * half).unwrap();
    let pattern: Vec<u8> = (0..half).map(|i| (i % 97) as u8).collect();
    b.copy_to_device(p, &pattern, S).unwrap();
    b.memset(p.offset(half), 0, half, S).unwrap();
    b.synchronize(S).unwrap();
    let import_dev = (b.device_count().unwrap() - 1).to_string();
    let (ok, text) = run_child("ipc", &[(HANDLE_ENV, hex(&handle.to_bytes())), (DEVICE_ENV, import_dev.clone())]);
    t.check(ok && text.contains("IPC-CHILD-OK"), || format!("IPC child on device {import_dev} failed:\n{text}"));
    t.check(download(b, p.offset(half), half) == pattern, || "the child's writes are visible to the exporter".into());
    // In this process the import is the exporter's own address; the memory lives until both
    // are released.
    let again = b.import(0, &ShareHandle::from_bytes(&handle.to_bytes()).unwrap()).unwrap();
    t.check(again == p, || "a same-process import shares the address".into());
    b.free(p).unwrap();
    t.check(download(b, again, 16) == pattern[..16], || "an import outlives the export's free".into());
    b.close_import(again).unwrap();
    t.check(b.close_import(again).is_err(), || "double close_import".into());
    let bad = ShareHandle::new(rustccl::backend::BackendKind::Cuda, 64, &[7u8; 64]).unwrap();
    t.check(b.import(0, &bad).is_err(), || "a garbage IPC handle is refused".into());
    let host = ShareHandle::new(rustccl::backend::BackendKind::Host, 64, b"rustccl-x").unwrap();
    t.check(b.import(0, &host).unwrap_err().code == ResultCode::InvalidArgument, || "another backend's handle".into());
}

/// The child's side of the IPC test: import, check, copy into the parent's memory.
fn ipc_child() {
    let b = CudaBackend::shared().unwrap();
    let device: usize = std::env::var(DEVICE_ENV).unwrap().parse().unwrap();
    let handle = ShareHandle::from_bytes(&unhex(&std::env::var(HANDLE_ENV).unwrap())).unwrap();
    let half = (handle.bytes() / 2) as usize;
    let p = b.import(device, &handle).unwrap();
    let got = download(&b, p, half);
    let pattern: Vec<u8> = (0..half).map(|i| (i % 97) as u8).collect();
    assert!(got == pattern, "the child reads the parent's data");
    // second half = first half (a copy reading and writing imported memory).
    let s = b.create_stream(device).unwrap();
    b.copy(p.offset(half), p, half, s).unwrap();
    b.synchronize(s).unwrap();
    b.close_import(p).unwrap();
    println!("IPC-CHILD-OK on device {device}");
}

/// The child's side of the cache test: load the collective kernels (its log says whether each
/// came from the cache).
fn cache_child() {
    rustccl::log::init();
    let start = Instant::now();
    let b = CudaBackend::shared().unwrap();
    let init = start.elapsed();
    let n = b.preload_exec_kernels(0).unwrap();
    println!(
        "CACHE-CHILD kernels={n} init_ms={:.1} total_ms={:.1}",
        init.as_secs_f64() * 1e3,
        start.elapsed().as_secs_f64() * 1e3
    );
}

#[test]
fn child_process() {
    match std::env::var(CHILD_ENV).as_deref() {
        Ok("ipc") => ipc_child(),
        Ok("cache") => cache_child(),
        _ => {} // only a child role does anything
    }
}

#[test]
fn cuda_backend() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    // A fresh kernel cache, so the first compile and the second process's hit are both seen.
    let cache_dir = std::env::temp_dir().join(format!("rustccl-cuda-test-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache_dir);
    // SAFETY (edition 2021: safe): set before any thread reads it; the other test in this
    // binary does nothing without a child role.
    std::env::set_var(rustccl_kernels::CACHE_DIR_ENV, &cache_dir);

    let Some(b) = backend_or_skip() else { return };
    let mut t = Tally::default();
    let count = b.device_count().unwrap();
    let names: Vec<String> = (0..count).map(|d| b.device_name(d).unwrap()).collect();
    println!("cuda_backend: driver {}, {count} device(s): {}", b.driver_version(), names.join(", "));

    // The kernels: compiled once (fresh cache: one file each), then a second process must hit
    // the cache for every one.
    let start = Instant::now();
    let kernels = b.preload_exec_kernels(0).unwrap();
    let files = std::fs::read_dir(&cache_dir).map(|d| d.count()).unwrap_or(0);
    t.check(files == kernels, || format!("a fresh cache gets one file per kernel: {files} for {kernels}"));
    println!("cuda_backend: {kernels} collective kernels compiled in {:.1} s", start.elapsed().as_secs_f64());
    let (ok, text) =
        run_child("cache", &[("NCCL_DEBUG", "INFO".to_string()), ("NCCL_DEBUG_SUBSYS", "INIT".to_string())]);
    let line = text.lines().find(|l| l.contains("CACHE-CHILD")).unwrap_or("").to_string();
    let hits = text.lines().filter(|l| l.contains("kernel cache hit")).count();
    let hit_log = text.lines().find(|l| l.contains("kernel cache hit")).unwrap_or("").to_string();
    t.check(ok && line.contains(&format!("kernels={kernels}")) && hits == kernels, || {
        format!("second process cache hits ({hits} of {kernels}):\n{text}")
    });
    t.check(!text.contains("compiled by NVRTC"), || format!("the second process compiled:\n{text}"));
    println!("cuda_backend: second process: {line}");
    println!("cuda_backend: its log: {}", hit_log.trim());

    for d in 0..count {
        memory_and_copies(&b, d, &mut t);
        streams_and_events(&b, d, &mut t);
        host_memory(&b, d, &mut t);
    }
    if count >= 2 {
        cross_device(&b, &mut t);
    }
    ipc_between_processes(&b, &mut t);
    let _ = std::fs::remove_dir_all(&cache_dir);
    say(&format!("cuda_backend: {} passed, {} failed", t.passed, t.failed.len()));
    assert!(t.failed.is_empty(), "{} checks failed; first: {}", t.failed.len(), t.failed[0]);
}
