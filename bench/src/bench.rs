//! One rank's benchmark: for every operation, type, operator, root and size, a checked run
//! (with `-c 1`), warm-up, the timed iterations, and the row rank 0 prints.

use std::io::Write;
use std::time::Instant;

use rustccl::types::DataType;
use serde_json::json;

use crate::data::{poison_byte, seed_of, Expect, Gen, Want};
use crate::driver::{Call, Driver, Result};
use crate::format::{self, Half, Row};
use crate::ops::{a2av_counts, bandwidth, premul_scalar, type_name, Coll, Layout, Redop};
use crate::opts::{register_text, JsonOut, Options, REGISTER_NONE};

/// The exit status of a rank whose data check found wrong elements (the launcher turns it
/// into a plain failure without a message of its own).
pub const EXIT_WRONG_DATA: i32 = 3;

/// How a rank ended, for its exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub wrong_total: u64,
}

/// Test hook: the rank whose checked outputs get one corrupted element (see `check_run`).
pub const INJECT_VAR: &str = "RUSTCCL_BENCH_INJECT_ERROR";

/// Mismatches printed (to stderr) per rank, at most.
const MAX_REPORTS: usize = 24;

struct Bench<'a> {
    o: &'a Options,
    drv: &'a mut dyn Driver,
    rank: usize,
    n: usize,
    out: Option<Box<dyn Write>>,
    send_buf: u64,
    recv_buf: u64,
    host_in: Vec<u8>,
    host_out: Vec<u8>,
    rows: Vec<Row>,
    wrong_total: u64,
    bw_sum: f64,
    bw_count: usize,
    reports_left: usize,
}

fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "?".into())
}

/// The `# Using devices` line of this rank.
pub fn device_line(rank: usize, pid: u32, host: &str, device: usize, desc: &str) -> String {
    format!(
        "#  Rank {rank:2} Group {:2} Pid {pid:6} on {host:>10} device {device:2} {desc}",
        0
    )
}

/// Runs the whole benchmark on this rank; rank 0 prints. Returns the total of wrong elements.
pub fn run(o: &Options, drv: &mut dyn Driver) -> Result<Outcome> {
    let rank = drv.rank();
    let n = drv.nranks();
    let out: Option<Box<dyn Write>> = match (rank, &o.json) {
        (0, Some(JsonOut::Stdout)) => Some(Box::new(std::io::stderr())),
        (0, _) => Some(Box::new(std::io::stdout())),
        _ => None,
    };
    let mut b = Bench {
        o,
        drv,
        rank,
        n,
        out,
        send_buf: 0,
        recv_buf: 0,
        host_in: Vec::new(),
        host_out: Vec::new(),
        rows: Vec::new(),
        wrong_total: 0,
        bw_sum: 0.0,
        bw_count: 0,
        reports_left: MAX_REPORTS,
    };
    let devices = b.header()?;
    // Every layout fits in the largest size (nccl-tests allocates maxBytes for both). With
    // -R they are registered (collectively for -R 2: every rank, send then receive).
    let bytes = o.max_bytes.max(1);
    if o.local_register != REGISTER_NONE {
        b.send_buf = b.drv.alloc_registered(bytes, o.local_register)?;
        b.recv_buf = b.drv.alloc_registered(bytes, o.local_register)?;
    } else {
        b.send_buf = b.drv.alloc(bytes)?;
        b.recv_buf = b.drv.alloc(bytes)?;
    }
    for &coll in &o.ops {
        b.run_coll(coll)?;
    }
    let avg = if b.bw_count > 0 {
        b.bw_sum / b.bw_count as f64
    } else {
        0.0
    };
    for l in format::footer(b.wrong_total, avg) {
        b.print(&l);
    }
    let names: Vec<&str> = o.ops.iter().map(|c| c.name()).collect();
    b.print(&format!("# Collective test concluded: {}", names.join(" ")));
    // The launcher's --plot reads the same document from the file it names.
    let rows_file = std::env::var(crate::plot::ROWS_VAR).ok().filter(|p| !p.is_empty());
    if rank == 0 && (o.json.is_some() || rows_file.is_some()) {
        {
            let doc = json!({
                "benchmark": "rustccl-bench",
                "version": env!("CARGO_PKG_VERSION"),
                "driver": b.drv.describe(),
                "nranks": n,
                "devices": devices,
                "params": {
                    "op": o.op_arg, "minBytes": o.min_bytes, "maxBytes": o.max_bytes,
                    "stepFactor": o.step_factor, "stepBytes": o.step_bytes, "iters": o.iters,
                    "warmupIters": o.warmup, "aggIters": o.agg_iters, "check": o.check,
                    "redop": o.redop_arg, "datatype": o.dtype_arg, "average": o.average.code(), "cudaGraphLaunches": o.cudagraph,
                    "localRegister": o.local_register,
                },
                "results": b.rows.iter().map(format::row_json).collect::<Vec<_>>(),
                "out_of_bounds": b.wrong_total,
                "avg_busbw_gbs": avg,
            });
            let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n";
            if let Some(p) = &rows_file {
                std::fs::write(p, &text).map_err(|e| format!("cannot write {p}: {e}"))?;
            }
            match &o.json {
                None => {}
                Some(JsonOut::Stdout) => {
                    let mut so = std::io::stdout().lock();
                    so.write_all(text.as_bytes())
                        .and_then(|_| so.flush())
                        .map_err(|e| format!("stdout: {e}"))?;
                }
                Some(JsonOut::File(p)) => {
                    std::fs::write(p, text).map_err(|e| format!("cannot write {p}: {e}"))?
                }
            }
        }
    }
    let (s, r) = (b.send_buf, b.recv_buf);
    b.drv.free(s)?;
    b.drv.free(r)?;
    Ok(Outcome {
        wrong_total: b.wrong_total,
    })
}

impl Bench<'_> {
    fn print(&mut self, line: &str) {
        if let Some(w) = self.out.as_mut() {
            let _ = writeln!(w, "{line}");
            let _ = w.flush();
        }
    }

    /// Prints the header (rank 0); returns the device lines.
    fn header(&mut self) -> Result<Vec<String>> {
        let (dev, desc) = self.drv.device();
        let line = device_line(self.rank, std::process::id(), &host_name(), dev, &desc);
        let mut fixed = [0u8; 256];
        let l = line.len().min(fixed.len());
        fixed[..l].copy_from_slice(&line.as_bytes()[..l]);
        let all = self.drv.allgather(&fixed)?;
        let lines: Vec<String> = all
            .iter()
            .map(|b| {
                String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap_or(&[])).into_owned()
            })
            .collect();
        let o = self.o;
        let desc = self.drv.describe();
        self.print(&format!(
            "# rustccl-bench version {} ({}) op: {}",
            env!("CARGO_PKG_VERSION"),
            desc,
            o.op_arg
        ));
        self.print(&format!(
            "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} agg iters: {} validation: {} graph: {}",
            o.min_bytes,
            o.max_bytes,
            o.step_text(),
            o.warmup,
            o.iters,
            o.agg_iters,
            o.check,
            o.cudagraph
        ));
        if o.auto_iters {
            self.print(&format!(
                "# iters: {} per size, fewer (at least 2) where they would take over {} s; -n sets an exact count",
                o.iters,
                crate::opts::AUTO_BUDGET_S
            ));
        }
        if o.local_register != REGISTER_NONE {
            self.print(&format!(
                "# local register: {} ({}, send and receive buffers)",
                o.local_register,
                register_text(o.local_register)
            ));
        }
        self.print("#");
        self.print("# Using devices");
        for l in &lines {
            self.print(l);
        }
        self.print("#");
        Ok(lines)
    }

    fn run_coll(&mut self, coll: Coll) -> Result<()> {
        if self.o.ops.len() > 1 {
            self.print(&format!("# Collective test starting: {}", coll.name()));
        }
        for l in format::table_header() {
            self.print(&l);
        }
        let redops: Vec<Option<Redop>> = if coll.has_redop() {
            self.o.redops.iter().map(|&r| Some(r)).collect()
        } else {
            vec![None]
        };
        let roots: Vec<i32> = if coll.has_root() {
            self.o.roots(self.n)
        } else {
            vec![-1]
        };
        let sizes = self.o.sizes();
        for &dtype in &self.o.dtypes.clone() {
            for &redop in &redops {
                for &root in &roots {
                    for &size in &sizes {
                        self.run_row(coll, dtype, redop, root, size)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn run_row(
        &mut self,
        coll: Coll,
        dtype: DataType,
        redop: Option<Redop>,
        root: i32,
        size: usize,
    ) -> Result<()> {
        let e = dtype.size();
        let layout = Layout::new(coll, size / e, self.n);
        let oop = self.run_half(coll, dtype, redop, root, size, &layout, false)?;
        let ip = self.run_half(coll, dtype, redop, root, size, &layout, true)?;
        let row = Row {
            coll,
            size: layout.size_bytes(e),
            count: layout.param_count,
            dtype,
            redop,
            root,
            out_of_place: oop,
            in_place: ip,
        };
        let line = format::row_line(&row);
        self.print(&line);
        self.rows.push(row);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn run_half(
        &mut self,
        coll: Coll,
        dtype: DataType,
        redop: Option<Redop>,
        root: i32,
        size: usize,
        layout: &Layout,
        in_place: bool,
    ) -> Result<Half> {
        let (rank, n, e) = (self.rank, self.n, dtype.size());
        let (send, recv) = if in_place {
            let base = self.recv_buf;
            (
                base + (layout.send_inplace * rank * e) as u64,
                base + (layout.recv_inplace * rank * e) as u64,
            )
        } else {
            (self.send_buf, self.recv_buf)
        };
        let call = Call {
            coll,
            send,
            recv,
            count: layout.param_count,
            dtype,
            redop: redop.unwrap_or(Redop::Sum),
            scalar: premul_scalar(rank),
            root: root.max(0),
            rank,
            nranks: n,
            vcounts: (coll == Coll::AlltoAllv)
                .then(|| a2av_counts(layout.param_count / n, n, rank)),
        };
        let checked = self.o.check > 0 && (!in_place || coll.in_place_checked());
        let mut wrong_local = 0u64;
        if checked {
            let redop_idx = redop.map(|r| r as u64 + 1).unwrap_or(0);
            let seed = seed_of(&[
                coll as u64,
                dtype as u64,
                redop_idx,
                root as u64,
                size as u64,
                in_place as u64,
            ]);
            let gen = Gen::new(coll, dtype, redop, n, seed);
            let expect = Expect::new(
                coll,
                gen,
                redop,
                *layout,
                rank,
                n,
                root.max(0) as usize,
                in_place,
            );
            for _ in 0..self.o.check {
                wrong_local += self.check_run(&call, layout, &expect, in_place)?;
            }
        }
        // Warm-up; with automatic iterations it also measures one iteration, and the slowest
        // rank's measure (one small allgather, which is also the barrier) sets the count.
        let tw = Instant::now();
        let probes = if self.o.auto_iters {
            self.o.warmup.max(1)
        } else {
            self.o.warmup
        };
        for _ in 0..probes {
            self.drv.launch(&call, self.o.agg_iters)?;
        }
        self.drv.sync()?;
        let iters = if self.o.auto_iters {
            let est = tw.elapsed().as_secs_f64() / probes as f64;
            let all = self.drv.allgather(&est.to_le_bytes())?;
            let worst = all
                .iter()
                .map(|b| f64::from_le_bytes(b[..8].try_into().unwrap()))
                .fold(0.0, f64::max);
            self.o.auto_iters(worst)
        } else {
            self.drv.barrier()?;
            self.o.iters
        };
        let secs = if self.o.cudagraph > 0 {
            self.time_graph(&call, iters)?
        } else {
            let t0 = Instant::now();
            for _ in 0..iters {
                self.drv.launch(&call, self.o.agg_iters)?;
            }
            self.drv.sync()?;
            t0.elapsed().as_secs_f64() / (iters * self.o.agg_iters) as f64
        };
        // Every rank's time and wrong count, in one small allgather.
        let mut mine = [0u8; 16];
        mine[..8].copy_from_slice(&secs.to_le_bytes());
        mine[8..].copy_from_slice(&wrong_local.to_le_bytes());
        let all = self.drv.allgather(&mine)?;
        let times: Vec<f64> = all
            .iter()
            .map(|b| f64::from_le_bytes(b[..8].try_into().unwrap()))
            .collect();
        let wrong: u64 = all
            .iter()
            .map(|b| u64::from_le_bytes(b[8..16].try_into().unwrap()))
            .sum();
        let t = self.o.average.reduce(&times);
        let (algbw, busbw) = bandwidth(coll, layout, dtype, n, t);
        self.bw_sum += busbw;
        self.bw_count += 1;
        if checked {
            self.wrong_total += wrong;
        }
        Ok(Half {
            time_us: t * 1e6,
            algbw,
            busbw,
            wrong: checked.then_some(wrong),
            iters,
        })
    }

    /// `-G`: captures the `iters` launches into a CUDA graph, then (after a barrier) times
    /// `cudagraph` launches of it; seconds per operation. The graph is destroyed either way.
    fn time_graph(&mut self, call: &Call, iters: usize) -> Result<f64> {
        let launches = self.o.cudagraph;
        self.drv.graph_begin()?;
        let captured = (0..iters).try_for_each(|_| self.drv.launch(call, self.o.agg_iters));
        // The capture always ends, so that the stream is usable whatever happened.
        let graph = match (captured, self.drv.graph_end()) {
            (Ok(()), Ok(g)) => g,
            (Ok(()), Err(end)) => return Err(end),
            (Err(e), Ok(g)) => {
                let _ = self.drv.graph_destroy(g);
                return Err(format!("while capturing a CUDA graph (-G): {e}"));
            }
            (Err(e), Err(end)) => {
                return Err(format!("while capturing a CUDA graph (-G): {e}; then {end}"))
            }
        };
        let timed = (|| -> Result<f64> {
            self.drv.barrier()?;
            let t0 = Instant::now();
            for _ in 0..launches {
                self.drv.graph_launch(&graph)?;
            }
            self.drv.sync()?;
            Ok(t0.elapsed().as_secs_f64())
        })();
        let destroyed = self.drv.graph_destroy(graph);
        let secs = timed?;
        destroyed?;
        Ok(secs / (launches * iters * self.o.agg_iters) as f64)
    }

    /// One checked run: poison the output, write the inputs, run once, compare every element.
    fn check_run(
        &mut self,
        call: &Call,
        layout: &Layout,
        expect: &Expect,
        in_place: bool,
    ) -> Result<u64> {
        let t = call.dtype;
        let e = t.size();
        let (rank, poison) = (self.rank, poison_byte(t));
        if in_place {
            let send_end = (layout.send_inplace * rank + layout.send_count) * e;
            let recv_end = (layout.recv_inplace * rank + layout.recv_count) * e;
            self.drv
                .memset(self.recv_buf, poison, send_end.max(recv_end))?;
        } else {
            self.drv.memset(call.recv, poison, layout.recv_count * e)?;
        }
        self.host_in.resize(layout.send_count * e, 0);
        expect.gen.fill(rank, 0, &mut self.host_in);
        if !self.host_in.is_empty() {
            let input = std::mem::take(&mut self.host_in);
            let r = self.drv.upload(call.send, &input);
            self.host_in = input;
            r?;
        }
        self.drv.launch(call, 1)?;
        self.drv.sync()?;
        self.host_out.resize(layout.recv_count * e, 0);
        if !self.host_out.is_empty() {
            let mut out = std::mem::take(&mut self.host_out);
            let r = self.drv.download(&mut out, call.recv);
            self.host_out = out;
            r?;
        }
        // Test hook: flip the lowest bit of element 0 on the rank this variable names, so that a
        // test can see a wrong element reported end to end.
        if std::env::var(INJECT_VAR)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            == Some(rank)
        {
            if let Some(b) = self.host_out.first_mut() {
                *b ^= 1;
            }
        }
        let budget = self.reports_left.min(3);
        let mut reported = 0;
        let what = format!(
            "{} {} {} root {} count {} {}",
            call.coll.name(),
            type_name(t),
            format::redop_name(expect.redop),
            call.root,
            call.count,
            if in_place { "in-place" } else { "out-of-place" }
        );
        let wrong = expect.count_wrong(&self.host_out, budget, |j, want, got| {
            let want = match want {
                Want::Value(v) => format!("{v}"),
                Want::Poison => "untouched".to_string(),
            };
            let got_hex: String = got.iter().rev().map(|b| format!("{b:02x}")).collect();
            eprintln!(
                "rustccl-bench: rank {rank}: {what}: element {j}: expected {want}, got {} (0x{got_hex})",
                crate::data::decode(t, got)
            );
            reported += 1;
        });
        self.reports_left -= reported;
        Ok(wrong)
    }
}
