//! The CUDA backend on a real GPU: every trait method, on every visible device, against the
//! host reference of `rustccl::reduce`.
//!
//! Without a CUDA driver (CI) the test is SKIPPED, with the reason printed, after checking
//! that asking for the CUDA backend is a clear error and not a panic. On the GPU machine it
//! runs for real:
//! - alloc/copy round trips, memset, offsets, bad ranges and frees refused;
//! - streams and events: ordering across two streams through an event, queries, a caller's
//!   own `CUstream` (what a `cudaStream_t` is), the default stream with and without a current
//!   context, and the caller's current context left as it was;
//! - host-mapped and registered host memory read by a kernel and written by copies/fills;
//! - `LocalPlan` Reduce for every operator x every type x several input counts (1, 2, 3, 8,
//!   and 40, which chains launches), out of place and in place, on fresh random data with
//!   special values, outputs poisoned first, compared bit for bit with `Reducer`;
//! - CUDA IPC between two processes: this test binary runs itself as the child
//!   (`RUSTCCL_CUDA_TEST_CHILD=ipc`), which imports the parent's memory, reads it, reduces
//!   into it and exits; the parent sees the child's writes;
//! - the kernel cache: the first compile in a fresh cache directory, then a second process
//!   (`RUSTCCL_CUDA_TEST_CHILD=cache`) that must find the kernels in the cache (its log line
//!   says "kernel cache hit") and load them without compiling.
//!
//! It prints one summary line: `cuda_backend: N passed, M failed`.

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys;
use rustccl::backend::{backend_from_name, CudaBackend, DeviceBackend, DevicePtr, LocalPlan, ShareHandle, Stream};
use rustccl::reduce::{DevOp, Reducer};
use rustccl::types::{DataType, RedOp};
use rustccl::ResultCode;

const CHILD_ENV: &str = "RUSTCCL_CUDA_TEST_CHILD";
const HANDLE_ENV: &str = "RUSTCCL_CUDA_TEST_HANDLE";
const DEVICE_ENV: &str = "RUSTCCL_CUDA_TEST_DEVICE";
const S: Stream = Stream::DEFAULT;

/// xorshift64*: reproducible data (the seed is printed).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

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
    t.check(b.host_address(c, 1).unwrap_err().code == ResultCode::InvalidUsage, || "host_address".into());
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
    let mut plan = LocalPlan::new();
    plan.copy(a, out, 4096);
    b.launch(&plan, user).unwrap();
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
    // A kernel reads host-mapped memory; a copy and a fill write it.
    let dst = b.alloc(d, n).unwrap();
    let mut plan = LocalPlan::new();
    plan.reduce(dst, vec![m.device, m.device], n, DataType::Uint8, RedOp::Sum, None)
        .copy(m.device.offset(n / 2), dst, n / 2)
        .fill(m.device, 16, 0xAB);
    b.launch(&plan, S).unwrap();
    b.synchronize(S).unwrap();
    let want: Vec<u8> = (0..n)
        .map(|i| {
            if i < 16 {
                0xAB
            } else if i < n / 2 {
                (i % 100) as u8
            } else {
                2 * ((i - n / 2) % 100) as u8
            }
        })
        .collect();
    t.check(host == want.as_slice(), || format!("dev {d}: host-mapped memory through a plan"));
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

// ---- reductions -----------------------------------------------------------------------------

/// Random elements of `dtype`, with special values (±0, ±inf, NaN, extremes, subnormals)
/// now and then for the float types; never NaN or infinite inputs for fp8 (NCCL's inputs).
fn random_elems(rng: &mut Rng, dtype: DataType, count: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dtype.size());
    for _ in 0..count {
        let r = rng.next();
        let special = rng.below(16) == 0;
        match dtype {
            DataType::Float16 | DataType::Bfloat16 => {
                let specials: [u16; 8] = if dtype == DataType::Float16 {
                    [0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7bff, 0x0001, 0x8400]
                } else {
                    [0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f7f, 0x0001, 0x8080]
                };
                let v = if special { specials[(r % 8) as usize] } else { small_float_bits16(r, dtype) };
                out.extend_from_slice(&v.to_ne_bytes());
            }
            DataType::Float32 => {
                let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MAX, 1e-45, -1e-40];
                let v = if special {
                    specials[(r % 8) as usize]
                } else {
                    ((r >> 11) as f64 / (1u64 << 53) as f64 * 200.0 - 100.0) as f32
                };
                out.extend_from_slice(&v.to_ne_bytes());
            }
            DataType::Float64 => {
                let specials = [0.0f64, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, f64::MAX, 5e-324, -1e-310];
                let v = if special {
                    specials[(r % 8) as usize]
                } else {
                    (r >> 11) as f64 / (1u64 << 53) as f64 * 200.0 - 100.0
                };
                out.extend_from_slice(&v.to_ne_bytes());
            }
            DataType::Float8e4m3 => {
                let mut v = r as u8;
                if v & 0x7f == 0x7f {
                    v &= 0xfe;
                }
                out.push(v);
            }
            DataType::Float8e5m2 => {
                let mut v = r as u8;
                if v & 0x7c == 0x7c {
                    v &= 0xfb;
                }
                out.push(v);
            }
            _ => out.extend_from_slice(&r.to_ne_bytes()[..dtype.size()]),
        }
    }
    out
}

/// Random finite half/bfloat16 bits with magnitudes that make sums and products interesting
/// (mostly moderate exponents, sometimes anything finite).
fn small_float_bits16(r: u64, dtype: DataType) -> u16 {
    let bits = (r >> 16) as u16;
    let (exp_mask, exp_shift, bias) = if dtype == DataType::Float16 { (0x1f, 10, 15) } else { (0xff, 7, 127) };
    if r % 4 == 0 {
        // Anything finite.
        let e = (bits >> exp_shift) & exp_mask;
        if e == exp_mask {
            bits & !(1 << exp_shift)
        } else {
            bits
        }
    } else {
        let e = (bias - 4 + (r >> 8) % 9) as u16; // 2^-4 .. 2^4
        (bits & 0x8000) | (e << exp_shift) | (bits & ((1 << exp_shift) - 1))
    }
}

/// The reference: `Reducer` over the inputs as a `Reduce` step defines it.
fn reference(dtype: DataType, op: RedOp, scalar: Option<f64>, inputs: &[Vec<u8>]) -> Vec<u8> {
    let devop = DevOp::from_user(op, scalar, dtype, inputs.len()).unwrap();
    let r = Reducer::new(dtype, devop);
    let mut acc = vec![0u8; inputs[0].len()];
    r.pre(&inputs[0], &mut acc);
    for x in &inputs[1..] {
        r.pre_combine_into(&mut acc, x);
    }
    r.post(&mut acc);
    acc
}

/// Equal bits; for f32/f64, any NaN equals any NaN (payloads are not part of the contract).
fn same(dtype: DataType, got: &[u8], want: &[u8]) -> Option<usize> {
    let size = dtype.size();
    (0..got.len() / size).find(|i| {
        let (g, w) = (&got[i * size..(i + 1) * size], &want[i * size..(i + 1) * size]);
        if g == w {
            return false;
        }
        match dtype {
            DataType::Float32 => {
                !(f32::from_ne_bytes(g.try_into().unwrap()).is_nan()
                    && f32::from_ne_bytes(w.try_into().unwrap()).is_nan())
            }
            DataType::Float64 => {
                !(f64::from_ne_bytes(g.try_into().unwrap()).is_nan()
                    && f64::from_ne_bytes(w.try_into().unwrap()).is_nan())
            }
            _ => true,
        }
    })
}

fn reductions(b: &CudaBackend, d: usize, rng: &mut Rng, t: &mut Tally) -> usize {
    let ops = [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg, RedOp::PreMulSum];
    let mut cases = 0;
    for dtype in DataType::ALL {
        for op in ops {
            for nsrcs in [1usize, 2, 3, 8, 40] {
                if nsrcs == 40 && !matches!(op, RedOp::Sum | RedOp::PreMulSum | RedOp::Avg | RedOp::Max) {
                    continue;
                }
                let count = 1000 + rng.below(5000) as usize;
                let bytes = count * dtype.size();
                let scalar = (op == RedOp::PreMulSum).then(|| {
                    if dtype.is_float() {
                        (rng.below(4001) as f64 - 2000.0) / 1000.0
                    } else {
                        rng.below(11) as f64 - 5.0
                    }
                });
                let inputs: Vec<Vec<u8>> = (0..nsrcs).map(|_| random_elems(rng, dtype, count)).collect();
                let ptrs: Vec<DevicePtr> = inputs.iter().map(|x| upload(b, d, x)).collect();
                let want = reference(dtype, op, scalar, &inputs);

                // Out of place, into a poisoned buffer.
                let out = b.alloc(d, bytes).unwrap();
                b.memset(out, 0xA5, bytes, S).unwrap();
                let mut plan = LocalPlan::new();
                plan.reduce(out, ptrs.clone(), count, dtype, op, scalar);
                let r = b.launch(&plan, S).and_then(|()| b.synchronize(S));
                let what = || format!("dev {d}: {dtype} {op} x{nsrcs} (scalar {scalar:?}, {count} elements)");
                match r {
                    Err(e) => t.check(false, || format!("{}: {e}", what())),
                    Ok(()) => {
                        let got = download(b, out, bytes);
                        let bad = same(dtype, &got, &want);
                        t.check(bad.is_none(), || {
                            let i = bad.unwrap();
                            let s = dtype.size();
                            let ins: Vec<String> =
                                inputs.iter().take(4).map(|x| format!("{:02x?}", &x[i * s..(i + 1) * s])).collect();
                            format!(
                                "{} at {i}: got {:02x?} want {:02x?}, inputs {}",
                                what(),
                                &got[i * s..(i + 1) * s],
                                &want[i * s..(i + 1) * s],
                                ins.join(" ")
                            )
                        });
                    }
                }
                cases += 1;

                // In place: the output is one of the inputs (the last one, so with 40 inputs
                // the chained launches need their scratch accumulator).
                if nsrcs >= 2 {
                    let dst = ptrs[nsrcs - 1];
                    let mut plan = LocalPlan::new();
                    plan.reduce(dst, ptrs.clone(), count, dtype, op, scalar);
                    b.launch(&plan, S).unwrap();
                    let got = download(b, dst, bytes);
                    t.check(same(dtype, &got, &want).is_none(), || format!("{} in place", what()));
                    cases += 1;
                }
                b.free(out).unwrap();
                for p in ptrs {
                    b.free(p).unwrap();
                }
            }
        }
    }
    // A plan of several steps, and a bad plan that runs nothing.
    let x = upload(b, d, &[1u8; 64]);
    let y = b.alloc(d, 64).unwrap();
    let mut plan = LocalPlan::new();
    plan.fill(y, 64, 2).reduce(y, vec![y, x, x], 64, DataType::Uint8, RedOp::Sum, None).copy(x, y, 32);
    b.launch(&plan, S).unwrap();
    t.check(download(b, x, 64)[..33] == [[4u8; 32].as_slice(), &[1]].concat(), || "multi-step plan".into());
    let mut bad = LocalPlan::new();
    bad.fill(y, 64, 9).copy(y, DevicePtr(0x1000), 64);
    let e = b.launch(&bad, S).unwrap_err();
    t.check(e.code == ResultCode::InvalidArgument && e.message.starts_with("plan step 1"), || format!("bad plan: {e}"));
    t.check(download(b, y, 1) == [4], || "the fill before a bad step did not run".into());
    b.free(x).unwrap();
    b.free(y).unwrap();
    cases
}

/// A reduce on device 0 reading device 1's memory (peer access enabled on demand).
fn cross_device(b: &CudaBackend, t: &mut Tally) {
    let x = upload(b, 1, &[3u8; 256]);
    let y = upload(b, 0, &[4u8; 256]);
    let s = b.create_stream(0).unwrap();
    let mut plan = LocalPlan::new();
    plan.reduce(y, vec![y, x], 256, DataType::Uint8, RedOp::Sum, None);
    b.launch(&plan, s).unwrap();
    b.synchronize(s).unwrap();
    t.check(download(b, y, 256).iter().all(|&v| v == 7), || "reduce across devices".into());
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
    let want: Vec<u8> = pattern.iter().map(|v| 2 * v + 1).collect();
    t.check(download(b, p.offset(half), half) == want, || "the child's writes are visible to the exporter".into());
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

/// The child's side of the IPC test: import, check, reduce into the parent's memory.
fn ipc_child() {
    let b = CudaBackend::shared().unwrap();
    let device: usize = std::env::var(DEVICE_ENV).unwrap().parse().unwrap();
    let handle = ShareHandle::from_bytes(&unhex(&std::env::var(HANDLE_ENV).unwrap())).unwrap();
    let half = (handle.bytes() / 2) as usize;
    let p = b.import(device, &handle).unwrap();
    let got = download(&b, p, half);
    let pattern: Vec<u8> = (0..half).map(|i| (i % 97) as u8).collect();
    assert!(got == pattern, "the child reads the parent's data");
    // second half = first + first + 1 (a kernel reading and writing imported memory).
    let one = b.alloc(device, half).unwrap();
    b.memset(one, 1, half, S).unwrap();
    let s = b.create_stream(device).unwrap();
    let mut plan = LocalPlan::new();
    plan.reduce(p.offset(half), vec![p, p, one], half, DataType::Uint8, RedOp::Sum, None);
    b.launch(&plan, s).unwrap();
    b.synchronize(s).unwrap();
    b.close_import(p).unwrap();
    println!("IPC-CHILD-OK on device {device}");
}

/// The child's side of the cache test: load the kernels, say whether they came from the cache.
fn cache_child() {
    rustccl::log::init();
    let start = Instant::now();
    let b = CudaBackend::shared().unwrap();
    let init = start.elapsed();
    let info = b.preload_kernels(0).unwrap();
    println!(
        "CACHE-CHILD from_cache={} kernels_ms={:.1} init_ms={:.1} total_ms={:.1}",
        info.from_cache,
        info.time.as_secs_f64() * 1e3,
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
    let seed = std::env::var("RUSTCCL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        let mut s = [0u8; 8];
        getrandom::fill(&mut s).unwrap();
        u64::from_ne_bytes(s) | 1
    });
    let mut rng = Rng(seed);
    let mut t = Tally::default();
    let count = b.device_count().unwrap();
    let names: Vec<String> = (0..count).map(|d| b.device_name(d).unwrap()).collect();
    println!("cuda_backend: driver {}, {count} device(s): {}; seed {seed}", b.driver_version(), names.join(", "));

    // The kernels: compiled once (fresh cache), then a second process must hit the cache.
    let info = b.preload_kernels(0).unwrap();
    t.check(!info.from_cache, || "the first load in a fresh cache compiles".into());
    println!(
        "cuda_backend: kernels for {} compiled in {:.1} ms ({} bytes), cached at {:?}",
        info.arch,
        info.time.as_secs_f64() * 1e3,
        info.bytes,
        info.cache_path
    );
    let (ok, text) =
        run_child("cache", &[("NCCL_DEBUG", "INFO".to_string()), ("NCCL_DEBUG_SUBSYS", "INIT".to_string())]);
    let line = text.lines().find(|l| l.contains("CACHE-CHILD")).unwrap_or("").to_string();
    let hit_log = text.lines().find(|l| l.contains("kernel cache hit")).unwrap_or("").to_string();
    t.check(ok && line.contains("from_cache=true") && !hit_log.is_empty(), || {
        format!("second process cache hit:\n{text}")
    });
    t.check(!text.contains("compiled by NVRTC"), || format!("the second process compiled:\n{text}"));
    println!("cuda_backend: second process: {line}");
    println!("cuda_backend: its log: {}", hit_log.trim());

    let mut reduce_cases = 0;
    let start = Instant::now();
    for d in 0..count {
        memory_and_copies(&b, d, &mut t);
        streams_and_events(&b, d, &mut t);
        host_memory(&b, d, &mut t);
        reduce_cases += reductions(&b, d, &mut rng, &mut t);
        let k = b.kernel_info(d).unwrap();
        println!("cuda_backend: device {d} ({}, {}): kernels from_cache={}", names[d], k.arch, k.from_cache);
    }
    if count >= 2 {
        cross_device(&b, &mut t);
    }
    ipc_between_processes(&b, &mut t);
    println!(
        "cuda_backend: {reduce_cases} reduce cases (12 types x 6 ops x 1/2/3/8/40 inputs, in and out of place) on {count} device(s) in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&cache_dir);
    say(&format!("cuda_backend: {} passed, {} failed", t.passed, t.failed.len()));
    assert!(t.failed.is_empty(), "{} checks failed; first: {}", t.failed.len(), t.failed[0]);
}
