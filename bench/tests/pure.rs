//! Tests of the benchmark's pure parts: flags, sweep, layouts and bandwidth formulas, the
//! table, the codecs and reference data (against an independent host simulation of every
//! operation), and the C-ABI marshalling.

#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]

use rustccl::types::DataType;
use rustccl_bench::data::{self, decode, encode, poison_byte, round_to, Expect, Gen, Want};
use rustccl_bench::driver::cabi::{id_from_hex, id_to_hex, marshal, NcclUniqueId, Prim};
use rustccl_bench::driver::{scalar_bytes, Call};
use rustccl_bench::format::{self, fmt_g, time_str, Half, Row};
use rustccl_bench::ops::{
    a2av_count, a2av_counts, a2av_max_elems, bandwidth, premul_scalar, Coll, Layout, Redop,
};
use rustccl_bench::opts::{self, parse, parse_size, sweep, Average, JsonOut, RootSel};

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

fn p(s: &str) -> opts::Options {
    parse(&args(s), None).unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

fn perr(s: &str) -> String {
    parse(&args(s), None).expect_err(s)
}

// ---- flags -----------------------------------------------------------------------------------

#[test]
fn defaults_are_the_documented_sweep() {
    let o = p("");
    assert_eq!(o.ops, vec![Coll::AllReduce]);
    assert_eq!(
        (o.nranks, o.min_bytes, o.max_bytes, o.step_factor),
        (4, 8, 128 << 20, 2)
    );
    assert_eq!((o.iters, o.warmup, o.check, o.agg_iters), (20, 1, 1, 1));
    assert!(o.auto_iters);
    assert_eq!(o.redops, vec![Redop::Sum]);
    assert_eq!(o.dtypes, vec![DataType::Float32]);
    assert_eq!(o.root, RootSel::One(0));
    assert_eq!(o.average, Average::Max);
    assert_eq!(o.json, None);
    assert_eq!(o.sizes().len(), 25);
}

#[test]
fn every_flag_short_long_and_inline() {
    let o = p("reduce -N 3 -b 1K -e 2M -f 4 -n 7 -w 2 -m 3 -c 0 -o prod -d half -r 2 -a 1 -J out.json -T 9 -t 1 -g 1");
    assert_eq!(o.ops, vec![Coll::Reduce]);
    assert_eq!(
        (o.nranks, o.min_bytes, o.max_bytes, o.step_factor),
        (3, 1024, 2 << 20, 4)
    );
    assert_eq!(
        (o.iters, o.warmup, o.agg_iters, o.check, o.timeout_s),
        (7, 2, 3, 0, 9)
    );
    assert!(!o.auto_iters);
    assert_eq!(o.redops, vec![Redop::Prod]);
    assert_eq!(o.dtypes, vec![DataType::Float16]);
    assert_eq!(o.root, RootSel::One(2));
    assert_eq!(o.average, Average::Avg);
    assert_eq!(o.json, Some(JsonOut::File("out.json".into())));

    let o = p("--nranks=2 --minbytes 64 --maxbytes=1G --stepfactor=8 --iters=5 --warmup_iters 0 --check=1 --op=all --datatype=all --root=all --json -");
    assert_eq!(
        (
            o.nranks,
            o.min_bytes,
            o.max_bytes,
            o.step_factor,
            o.iters,
            o.warmup
        ),
        (2, 64, 1 << 30, 8, 5, 0)
    );
    assert_eq!(o.redops, Redop::ALL.to_vec());
    assert_eq!(o.dtypes, DataType::ALL.to_vec());
    assert_eq!(o.root, RootSel::All);
    assert_eq!(o.json, Some(JsonOut::Stdout));

    let o = p("-n5 -b8 -e64K -N2 -r-1");
    assert_eq!(
        (o.iters, o.min_bytes, o.max_bytes, o.nranks, o.root),
        (5, 8, 65536, 2, RootSel::All)
    );

    let o = p("--lib /x/libnccl.so.2 --host-memory --cudart /y/libcudart.so");
    assert_eq!(o.lib.as_deref(), Some("/x/libnccl.so.2"));
    assert_eq!(o.cudart.as_deref(), Some("/y/libcudart.so"));
    assert!(o.host_memory);
}

#[test]
fn cudagraph_flag() {
    assert_eq!(p("").cudagraph, 0);
    assert_eq!(p("-G 5").cudagraph, 5);
    assert_eq!(p("-G7").cudagraph, 7);
    assert_eq!(p("--cudagraph 3").cudagraph, 3);
    assert_eq!(p("--cudagraph=2 -g 1").cudagraph, 2);
    assert_eq!(p("-G 0").cudagraph, 0);
    // -G and -g are different flags.
    assert!(perr("-g 5").contains("one rank per process"));
    assert!(perr("-G -1").contains("too small"));
    assert!(perr("-G x").contains("not an integer"));
    assert!(perr("-G").contains("needs a value"));
    assert!(perr("--tune -G 2").contains("--tune does not take -G"));
    // -G loads the CUDA runtime for the Rust API too, so --cudart goes with it.
    assert_eq!(p("-G 2 --cudart /y/libcudart.so").cudart.as_deref(), Some("/y/libcudart.so"));
    assert!(perr("--cudart /y/libcudart.so").contains("--cudart goes with --lib or -G"));
    assert!(opts::USAGE.contains("-G, --cudagraph <n>"));
}

#[test]
fn local_register_flag() {
    assert_eq!(p("").local_register, opts::REGISTER_NONE);
    assert_eq!(p("-R 0").local_register, 0);
    assert_eq!(p("-R 1").local_register, opts::REGISTER_LOCAL);
    assert_eq!(p("-R 2").local_register, opts::REGISTER_SYMMETRIC);
    assert_eq!(p("-R2").local_register, 2);
    assert_eq!(p("--local_register 1").local_register, 1);
    assert_eq!(p("--local_register=2 -b 8 -e 1M").local_register, 2);
    assert_eq!(p("-R 2 --lib /x/libnccl.so.2").local_register, 2);
    assert!(perr("-R 3").contains("one of 0 (plain buffers), 1 (ncclCommRegister), 2 (symmetric windows)"));
    assert!(perr("-R -1").contains("one of 0"));
    assert!(perr("-R x").contains("not an integer"));
    assert!(perr("-R").contains("needs a value"));
    assert!(perr("--local-register 2").contains("unknown option"));
    assert!(opts::USAGE.contains("-R, --local_register <0|1|2>"));
    assert_eq!(opts::register_text(2), "symmetric windows: ncclMemAlloc + ncclCommWindowRegister");
    assert_eq!(opts::register_text(1), "local registration: ncclCommRegister");
}

#[test]
fn step_bytes_makes_an_additive_sweep() {
    let o = p("-b 1M -e 4M -i 1M");
    assert_eq!(o.step_factor, 1);
    assert_eq!(o.sizes(), vec![1 << 20, 2 << 20, 3 << 20, 4 << 20]);
    assert_eq!(o.step_text(), "1048576(bytes)");
    assert_eq!(p("").step_text(), "2(factor)");
    // -f given explicitly wins over -i, as in nccl-tests.
    assert_eq!(p("-i 1M -f 2").step_factor, 2);
}

#[test]
fn operation_spellings() {
    for s in [
        "all_reduce",
        "allreduce",
        "all_reduce_perf",
        "AllReduce",
        "all-reduce",
        "allreduce_perf",
    ] {
        assert_eq!(opts::parse_op(s).unwrap(), vec![Coll::AllReduce], "{s}");
    }
    for c in Coll::ALL {
        assert_eq!(opts::parse_op(c.name()).unwrap(), vec![c]);
        assert_eq!(
            opts::parse_op(&format!("{}_perf", c.name())).unwrap(),
            vec![c]
        );
    }
    assert_eq!(opts::parse_op("bcast").unwrap(), vec![Coll::Broadcast]);
    assert_eq!(
        opts::parse_op("alltoall_perf").unwrap(),
        vec![Coll::AlltoAll]
    );
    assert_eq!(opts::parse_op("all").unwrap(), Coll::ALL.to_vec());
    assert!(opts::parse_op("allreduce2").is_err());
    // A binary named like an operation selects it.
    let o = parse(&[], Some("all_gather_perf")).unwrap();
    assert_eq!(o.ops, vec![Coll::AllGather]);
    assert_eq!(
        parse(&[], Some("rustccl-bench")).unwrap().ops,
        vec![Coll::AllReduce]
    );
}

#[test]
fn type_and_operator_names() {
    use DataType::*;
    for (names, t) in [
        ("int8 char", Int8),
        ("uint8", Uint8),
        ("int32 int", Int32),
        ("uint32", Uint32),
        ("int64", Int64),
        ("uint64", Uint64),
        ("half float16 fp16", Float16),
        ("float float32 fp32", Float32),
        ("double float64", Float64),
        ("bfloat16 bf16", Bfloat16),
        ("f8e4m3 float8e4m3 fp8e4m3 e4m3", Float8e4m3),
        ("f8e5m2 float8e5m2 e5m2", Float8e5m2),
    ] {
        for n in names.split(' ') {
            assert_eq!(opts::parse_dtype_one(n), Some(t), "{n}");
        }
    }
    assert_eq!(
        opts::parse_dtypes("float,half,float").unwrap(),
        vec![Float32, Float16]
    );
    assert_eq!(
        opts::parse_redops("premulsum").unwrap(),
        vec![Redop::PreMulSum]
    );
    assert_eq!(
        opts::parse_redops("mulsum,max").unwrap(),
        vec![Redop::PreMulSum, Redop::Max]
    );
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    assert!(perr("-x 1").contains("unknown option"));
    assert!(perr("-b").contains("needs a value"));
    assert!(perr("-b 12Q").contains("invalid size"));
    assert!(perr("-b 1M -e 1K").contains("minbytes"));
    assert!(perr("-N 0").contains("too small"));
    assert!(perr("-n 0").contains("too small"));
    assert!(perr("-g 2").contains("one rank per process"));
    assert!(perr("-d float77").contains("unknown datatype"));
    assert!(perr("-o xor").contains("unknown reduction"));
    assert!(perr("broadcast -N 2 -r 2").contains("out of range"));
    assert!(perr("--host-memory").contains("--lib"));
    assert!(perr("-f 1 -i 0").contains("never grows"));
    assert!(perr("all_reduce all_gather").contains("unexpected argument"));
    assert!(perr("-a 7").contains("0 1 2 3"));
    assert!(perr("--help").contains("USAGE"));
    // A root beyond the ranks is fine when no operation has a root.
    assert!(parse(&args("all_reduce -N 2 -r 5"), None).is_ok());
}

#[test]
fn sizes_with_suffixes() {
    assert_eq!(parse_size("8").unwrap(), 8);
    assert_eq!(parse_size("1K").unwrap(), 1024);
    assert_eq!(parse_size("1k").unwrap(), 1024);
    assert_eq!(parse_size("128M").unwrap(), 128 << 20);
    assert_eq!(parse_size("2G").unwrap(), 2 << 30);
    assert_eq!(parse_size("0.5M").unwrap(), 512 << 10);
    assert_eq!(parse_size("64B").unwrap(), 64);
    assert!(parse_size("M").is_err());
    assert!(parse_size("-1").is_err());
}

#[test]
fn sweeps() {
    assert_eq!(sweep(8, 64 << 10, 8, 0), vec![8, 64, 512, 4096, 32768]);
    let s = sweep(8, 128 << 20, 2, 1 << 20);
    assert_eq!(s.len(), 25);
    assert_eq!((s[0], s[24]), (8, 128 << 20));
    assert_eq!(sweep(100, 100, 2, 0), vec![100]);
    assert_eq!(sweep(0, 4, 2, 0), vec![0, 1, 2, 4]);
    assert_eq!(sweep(10, 35, 1, 10), vec![10, 20, 30]);
    assert_eq!(
        sweep(usize::MAX - 1, usize::MAX, 2, 0),
        vec![usize::MAX - 1]
    );
}

#[test]
fn automatic_iterations() {
    let o = p("");
    assert_eq!(o.auto_iters(0.0001), 20);
    assert_eq!(o.auto_iters(0.05), 5);
    assert_eq!(o.auto_iters(10.0), 2);
    let o = p("-n 30");
    assert_eq!(o.auto_iters(10.0), 30);
    let o = p("-n 1");
    assert_eq!(o.auto_iters(10.0), 1);
}

#[test]
fn average_modes() {
    let t = [3.0, 1.0, 2.0];
    assert_eq!(Average::Rank0.reduce(&t), 3.0);
    assert_eq!(Average::Avg.reduce(&t), 2.0);
    assert_eq!(Average::Min.reduce(&t), 1.0);
    assert_eq!(Average::Max.reduce(&t), 3.0);
}

// ---- layouts and bandwidth ---------------------------------------------------------------------

#[test]
fn layouts_follow_nccl_tests() {
    let n = 4;
    let l = |c| Layout::new(c, 1003, n);
    // (send, recv, param, send_inplace, recv_inplace)
    let want = [
        (Coll::AllReduce, (1003, 1003, 1003, 0, 0)),
        (Coll::Broadcast, (1003, 1003, 1003, 0, 0)),
        (Coll::Reduce, (1003, 1003, 1003, 0, 0)),
        (Coll::SendRecv, (1003, 1003, 1003, 0, 0)),
        (Coll::AllGather, (250, 1000, 250, 250, 0)),
        (Coll::ReduceScatter, (1000, 250, 250, 0, 250)),
        (Coll::AlltoAll, (1000, 1000, 250, 0, 0)),
        (Coll::AlltoAllv, (1000, 1000, 1000, 0, 0)),
        (Coll::Gather, (250, 1000, 250, 250, 0)),
        (Coll::Scatter, (1000, 250, 250, 0, 250)),
    ];
    for (c, (s, r, pc, si, ri)) in want {
        let x = l(c);
        assert_eq!(
            (
                x.send_count,
                x.recv_count,
                x.param_count,
                x.send_inplace,
                x.recv_inplace
            ),
            (s, r, pc, si, ri),
            "{c:?}"
        );
        // Every buffer fits in the size it came from.
        assert!(x.send_count <= 1003 && x.recv_count <= 1003);
    }
    assert_eq!(Layout::new(Coll::AllGather, 1003, n).size_bytes(4), 4000);
    assert_eq!(Layout::new(Coll::AllGather, 3, 4).param_count, 0);
}

#[test]
fn bus_bandwidth_formulas() {
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b.abs().max(1.0);
    let t = DataType::Float32;
    // 1 MiB of floats (262144 elements) in 1 ms on 4 ranks.
    let count = 262144;
    let alg = 1048576.0 / 1e9 / 1e-3;
    for (c, alg_bytes_mult, factor) in [
        (Coll::AllReduce, 1.0, 1.5),
        (Coll::Broadcast, 1.0, 1.0),
        (Coll::Reduce, 1.0, 1.0),
        (Coll::SendRecv, 1.0, 1.0),
        (Coll::AllGather, 1.0, 0.75),
        (Coll::ReduceScatter, 1.0, 0.75),
        (Coll::AlltoAll, 1.0, 0.75),
        (Coll::Gather, 1.0, 0.75),
        (Coll::Scatter, 1.0, 0.75),
    ] {
        let l = Layout::new(c, count, 4);
        let (a, b) = bandwidth(c, &l, t, 4, 1e-3);
        assert!(close(a, alg * alg_bytes_mult), "{c:?} algbw {a}");
        assert!(close(b, a * factor), "{c:?} busbw {b}");
        assert!(close(c.bus_factor(4), factor));
    }
    // One rank: all-reduce moves nothing over the bus.
    assert_eq!(Coll::AllReduce.bus_factor(1), 0.0);
    assert_eq!(Coll::Broadcast.bus_factor(1), 1.0);
    assert!(close(Coll::AllReduce.bus_factor(2), 1.0));
    assert!(close(Coll::AllReduce.bus_factor(8), 1.75));
    // AlltoAllv: the most bytes any rank moves.
    let l = Layout::new(Coll::AlltoAllv, 4000, 4);
    let (a, b) = bandwidth(Coll::AlltoAllv, &l, t, 4, 1.0);
    assert!(close(a, (a2av_max_elems(1000, 4) * 4) as f64 / 1e9));
    assert!(close(b, a * 0.75));
    assert_eq!(bandwidth(Coll::AllReduce, &l, t, 4, 0.0), (0.0, 0.0));
}

#[test]
fn alltoallv_counts_are_consistent() {
    for n in 1..=7 {
        let base = 100;
        let all: Vec<_> = (0..n).map(|r| a2av_counts(base, n, r)).collect();
        for r in 0..n {
            for q in 0..n {
                assert_eq!(all[r].send_counts[q], all[q].recv_counts[r]);
                let c = a2av_count(base, n, r, q);
                assert!(c >= base / 2 && c <= base, "{n} {r} {q}: {c}");
            }
            let total: usize = all[r].send_counts.iter().sum();
            assert!(total <= base * n);
            let last = n - 1;
            assert_eq!(all[r].send_displs[last] + all[r].send_counts[last], total);
        }
        assert!(a2av_max_elems(base, n) <= base * n);
    }
    // Uneven when n is even: receive totals differ between ranks.
    let t: Vec<usize> = (0..4)
        .map(|r| a2av_counts(100, 4, r).recv_counts.iter().sum())
        .collect();
    assert!(t.iter().any(|&x| x != t[0]), "{t:?}");
}

// ---- the table -------------------------------------------------------------------------------

#[test]
fn time_and_g_formats() {
    assert_eq!(time_str(12.3456), "  12.35");
    assert_eq!(time_str(123.456), "  123.5");
    assert_eq!(time_str(12345.6), "  12346");
    assert_eq!(time_str(1234567.0), "1234567");
    assert_eq!(fmt_g(0.0), "0");
    assert_eq!(fmt_g(0.470202), "0.470202");
    assert_eq!(fmt_g(1.0), "1");
    assert_eq!(fmt_g(100.0), "100");
    assert_eq!(fmt_g(123456.0), "123456");
    assert_eq!(fmt_g(1234567.0), "1.23457e+06");
    assert_eq!(fmt_g(0.0001), "0.0001");
    assert_eq!(fmt_g(0.00001234), "1.234e-05");
    assert_eq!(fmt_g(2.5), "2.5");
    assert_eq!(fmt_g(337.123456), "337.123");
}

#[test]
fn table_lines_have_nccl_tests_layout() {
    let h = format::table_header();
    assert_eq!(h[1], "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong");
    assert_eq!(h[2], "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ");
    assert!(h[0].contains("out-of-place") && h[0].contains("in-place"));
    let row = Row {
        coll: Coll::AllReduce,
        size: 134217728,
        count: 33554432,
        dtype: DataType::Float32,
        redop: Some(Redop::Sum),
        root: -1,
        out_of_place: Half {
            time_us: 476.6,
            algbw: 281.62,
            busbw: 281.62,
            wrong: Some(0),
            iters: 20,
        },
        in_place: Half {
            time_us: 12345.6,
            algbw: 10.87,
            busbw: 10.87,
            wrong: None,
            iters: 20,
        },
    };
    assert_eq!(
        format::row_line(&row),
        "   134217728      33554432     float     sum      -1    476.6  281.62  281.62      0    12346   10.87   10.87    N/A"
    );
    // Columns line up with the titles: each title ends where its values end.
    let line = format::row_line(&row);
    for (title, value) in [
        ("size", "134217728"),
        ("count", "33554432"),
        ("type", "float"),
        ("root", "-1"),
    ] {
        assert_eq!(
            h[1].find(title).unwrap() + title.len(),
            line.find(value).unwrap() + value.len(),
            "{title}"
        );
    }
    let row2 = Row {
        redop: None,
        dtype: DataType::Bfloat16,
        coll: Coll::AllGather,
        root: 3,
        ..row.clone()
    };
    let l2 = format::row_line(&row2);
    assert!(l2.contains("  bfloat16    none       3  "), "{l2}");
    let f = format::footer(0, 0.470202);
    assert_eq!(f[0], "# Out of bounds values : 0 OK");
    assert_eq!(f[1], "# Avg bus bandwidth    : 0.470202 ");
    assert_eq!(
        format::footer(3, 1.0)[0],
        "# Out of bounds values : 3 FAILED"
    );
    let j = format::row_json(&row);
    assert_eq!(j["op"], "all_reduce");
    assert_eq!(j["type"], "float");
    assert_eq!(j["out_of_place"]["wrong"], 0);
    assert!(j["in_place"]["wrong"].is_null());
    assert_eq!(j["in_place"]["iters"], 20);
}

#[test]
fn device_line_layout() {
    let l = rustccl_bench::bench::device_line(1, 4242, "vm", 1, "[host] host device 1");
    assert_eq!(
        l,
        "#  Rank  1 Group  0 Pid   4242 on         vm device  1 [host] host device 1"
    );
}

// ---- codecs ----------------------------------------------------------------------------------

fn bits(t: DataType, v: f64) -> u64 {
    let mut b = [0u8; 8];
    encode(t, v, &mut b);
    u64::from_le_bytes(b) & (u64::MAX >> (64 - 8 * t.size()))
}

#[test]
fn float_encodings_match_the_formats() {
    use DataType::*;
    assert_eq!(bits(Float16, 1.0), 0x3c00);
    assert_eq!(bits(Float16, -2.0), 0xc000);
    assert_eq!(bits(Float16, 2048.0), 0x6800);
    assert_eq!(bits(Float16, 2.0f64.powi(-24)), 0x0001);
    assert_eq!(bits(Float16, 65504.0), 0x7bff);
    assert_eq!(bits(Bfloat16, 1.0), 0x3f80);
    assert_eq!(bits(Bfloat16, 256.0), 0x4380);
    assert_eq!(bits(Bfloat16, -3.0), 0xc040);
    assert_eq!(bits(Float8e4m3, 1.0), 0x38);
    assert_eq!(bits(Float8e4m3, 448.0), 0x7e);
    assert_eq!(bits(Float8e4m3, 2.0f64.powi(-9)), 0x01);
    assert_eq!(bits(Float8e4m3, -16.0), 0xd8);
    assert_eq!(bits(Float8e5m2, 1.0), 0x3c);
    assert_eq!(bits(Float8e5m2, 57344.0), 0x7b);
    assert_eq!(bits(Float8e5m2, 2.0f64.powi(-16)), 0x01);
    assert_eq!(bits(Float32, 1.0), 0x3f80_0000);
    assert_eq!(bits(Float64, 1.0), 0x3ff0_0000_0000_0000);
    assert_eq!(bits(Int8, -1.0), 0xff);
    assert_eq!(bits(Int32, -2.0), 0xffff_fffe);
    assert_eq!(bits(Uint64, 5.0), 5);
    // Rounding to nearest even, including the carry into the next binade.
    assert_eq!(round_to(Float16, 1.0 + 2.0f64.powi(-11)), 1.0);
    assert_eq!(
        round_to(Float16, 1.0 + 3.0 * 2.0f64.powi(-11)),
        1.0 + 2.0 * 2.0f64.powi(-10)
    );
    assert_eq!(round_to(Float8e4m3, 1.0 / 3.0), 0.34375);
    assert_eq!(round_to(Float8e5m2, 1.0 / 3.0), 0.3125);
    assert_eq!(round_to(Float8e4m3, 15.5), 16.0);
    assert_eq!(round_to(Bfloat16, 1.0 / 3.0), 0.333984375);
    assert_eq!(round_to(Float16, 1.0 / 3.0), 0.333251953125);
    assert_eq!(round_to(Float32, 1.0 / 3.0), (1.0f32 / 3.0) as f64);
    // The core's own conversions agree (two independent implementations).
    for i in -2000..2000 {
        let v = i as f64 / 7.0;
        assert_eq!(
            bits(Float16, v),
            rustccl::reduce::float::f64_to_f16(v) as u64,
            "{v}"
        );
        assert_eq!(
            bits(Bfloat16, v),
            rustccl::reduce::float::f64_to_bf16(v) as u64,
            "{v}"
        );
        if v.abs() <= 448.0 {
            assert_eq!(
                bits(Float8e4m3, v),
                rustccl::reduce::fp8::f64_to_e4m3(v) as u64,
                "{v}"
            );
        }
        assert_eq!(
            bits(Float8e5m2, v),
            rustccl::reduce::fp8::f64_to_e5m2(v) as u64,
            "{v}"
        );
    }
    // NaN patterns decode as NaN: the poison of the float types.
    for t in [Float16, Bfloat16, Float8e4m3, Float8e5m2] {
        let pb = [poison_byte(t); 2];
        let v = decode(t, &pb);
        assert!(v.is_nan() || v.abs() > 1e30, "{t:?} poison decodes to {v}");
    }
}

#[test]
fn every_value_of_every_type_round_trips() {
    for t in DataType::ALL {
        let (k, signed) = data::capacity(t);
        let lo = if signed { -k } else { 0 };
        let step = ((k - lo) / 5000).max(1);
        let mut v = lo;
        while v <= k {
            let mut b = [0u8; 8];
            encode(t, v as f64, &mut b);
            assert_eq!(decode(t, &b), v as f64, "{t:?} {v}");
            assert_ne!(
                &b[..t.size()],
                &[poison_byte(t); 8][..t.size()],
                "{t:?} {v} looks like poison"
            );
            v += step;
        }
    }
}

#[test]
fn premulsum_scalar_bytes() {
    assert_eq!(premul_scalar(0), 1.0);
    assert_eq!(premul_scalar(1), 2.0);
    assert_eq!(
        scalar_bytes(DataType::Float32, 2.0)[..4],
        2.0f32.to_ne_bytes()
    );
    assert_eq!(
        scalar_bytes(DataType::Float16, 2.0)[..2],
        0x4000u16.to_ne_bytes()
    );
    assert_eq!(scalar_bytes(DataType::Int64, 2.0), 2i64.to_ne_bytes());
    assert_eq!(scalar_bytes(DataType::Float8e4m3, 2.0)[0], 0x40);
}

// ---- reference data --------------------------------------------------------------------------

/// One step of a reduction in type `t`, rounded as a kernel stores it.
fn step(t: DataType, op: Redop, a: f64, b: f64) -> f64 {
    match op {
        Redop::Prod => round_to(t, a * b),
        Redop::Max => a.max(b),
        Redop::Min => a.min(b),
        _ => round_to(t, a + b),
    }
}

/// A reduction of the inputs as a collective might do it: pre-multiplication, then the
/// operands combined in `order`, then integer Avg's division.
fn reduce_in_order(t: DataType, op: Redop, xs: &[f64], order: &[usize], tree: bool) -> f64 {
    let n = xs.len();
    let pre: Vec<f64> = (0..n)
        .map(|p| match op {
            Redop::PreMulSum => round_to(t, xs[p] * premul_scalar(p)),
            Redop::Avg if t.is_float() => round_to(t, xs[p] * round_to(t, 1.0 / n as f64)),
            _ => xs[p],
        })
        .collect();
    let mut vals: Vec<f64> = order.iter().map(|&p| pre[p]).collect();
    let acc = if tree {
        while vals.len() > 1 {
            vals = vals
                .chunks(2)
                .map(|c| {
                    if c.len() == 2 {
                        step(t, op, c[0], c[1])
                    } else {
                        c[0]
                    }
                })
                .collect();
        }
        vals[0]
    } else {
        vals.iter().skip(1).fold(vals[0], |a, &b| step(t, op, a, b))
    };
    if op == Redop::Avg && !t.is_float() {
        ((acc as i64) / n as i64) as f64
    } else {
        acc
    }
}

#[test]
fn reductions_are_exact_in_any_order() {
    for t in DataType::ALL {
        for op in Redop::ALL {
            for n in [1usize, 2, 3, 4, 5, 7, 8, 16, 33, 64] {
                let gen = Gen::new(Coll::AllReduce, t, Some(op), n, 1234 + n as u64);
                let layout = Layout::new(Coll::AllReduce, 300, n);
                let ex = Expect::new(
                    Coll::AllReduce,
                    gen.clone(),
                    Some(op),
                    layout,
                    0,
                    n,
                    0,
                    false,
                );
                let fwd: Vec<usize> = (0..n).collect();
                let rev: Vec<usize> = (0..n).rev().collect();
                let rot: Vec<usize> = (0..n).map(|p| (p + n / 2) % n).collect();
                for i in 0..300 {
                    let xs: Vec<f64> = (0..n).map(|p| gen.x(p, i)).collect();
                    let Want::Value(want) = ex.want(i) else {
                        panic!()
                    };
                    let want = round_to(t, want);
                    for (order, tree) in [(&fwd, false), (&rev, false), (&rot, true), (&fwd, true)]
                    {
                        let got = reduce_in_order(t, op, &xs, order, tree);
                        assert_eq!(
                            got, want,
                            "{t:?} {op:?} n={n} i={i} xs={xs:?} order={order:?} tree={tree}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn inputs_vary_and_stay_in_range() {
    for t in DataType::ALL {
        let (k, signed) = data::capacity(t);
        for n in [2usize, 4, 9] {
            let g = Gen::new(Coll::AllGather, t, None, n, 7);
            let vals: Vec<f64> = (0..n)
                .flat_map(|p| (0..500).map(move |i| (p, i)))
                .map(|(p, i)| g.x(p, i))
                .collect();
            assert!(
                vals.iter()
                    .all(|v| v.abs() <= k as f64 && (signed || *v >= 0.0)),
                "{t:?}"
            );
            let distinct: std::collections::HashSet<u64> =
                vals.iter().map(|v| v.to_bits()).collect();
            assert!(
                distinct.len() > 8.min(k as usize),
                "{t:?}: {} distinct",
                distinct.len()
            );
            // Different seeds give different data.
            let g2 = Gen::new(Coll::AllGather, t, None, n, 8);
            assert!((0..100).any(|i| g.x(1, i) != g2.x(1, i)), "{t:?}");
        }
    }
}

/// An independent host model of every operation (out-of-place and in-place, nccl-tests'
/// buffer arrangement): the receive buffers of every rank after the operation.
fn simulate(
    coll: Coll,
    t: DataType,
    op: Option<Redop>,
    n: usize,
    root: usize,
    count: usize,
    in_place: bool,
    gen: &Gen,
) -> Vec<(Vec<u8>, usize)> {
    let e = t.size();
    let l = Layout::new(coll, count, n);
    let c = l.param_count;
    // Each rank's whole receive allocation (in place it also holds the input).
    let alloc = count * e;
    let mut bufs: Vec<Vec<u8>> = vec![vec![poison_byte(t); alloc]; n];
    let mut sends: Vec<Vec<u8>> = Vec::new();
    for r in 0..n {
        let mut s = vec![0u8; l.send_count * e];
        gen.fill(r, 0, &mut s);
        if in_place {
            let off = l.send_inplace * r * e;
            bufs[r][off..off + s.len()].copy_from_slice(&s);
        }
        sends.push(s);
    }
    let val = |r: usize, i: usize| decode(t, &sends[r][i * e..i * e + e]);
    let red = |i: usize| {
        let xs: Vec<f64> = (0..n).map(|p| val(p, i)).collect();
        let order: Vec<usize> = (0..n).collect();
        reduce_in_order(t, op.unwrap(), &xs, &order, false)
    };
    let recv_off = |r: usize| if in_place { l.recv_inplace * r * e } else { 0 };
    let put = |buf: &mut Vec<u8>, off: usize, j: usize, v: f64| {
        encode(t, v, &mut buf[off + j * e..off + j * e + e])
    };
    let mut out = bufs.clone();
    for r in 0..n {
        let o = recv_off(r);
        match coll {
            Coll::AllReduce => (0..c).for_each(|j| put(&mut out[r], o, j, red(j))),
            Coll::Reduce if r == root => (0..c).for_each(|j| put(&mut out[r], o, j, red(j))),
            Coll::Reduce => {}
            Coll::Broadcast => (0..c).for_each(|j| put(&mut out[r], o, j, val(root, j))),
            Coll::AllGather => (0..n * c).for_each(|j| put(&mut out[r], o, j, val(j / c, j % c))),
            Coll::ReduceScatter => (0..c).for_each(|j| put(&mut out[r], o, j, red(r * c + j))),
            Coll::AlltoAll => {
                (0..n * c).for_each(|j| put(&mut out[r], o, j, val(j / c, r * c + j % c)))
            }
            Coll::AlltoAllv => {
                let base = c / n;
                let me = a2av_counts(base, n, r);
                for p in 0..n {
                    let src = a2av_counts(base, n, p).send_displs[r];
                    for k in 0..me.recv_counts[p] {
                        put(&mut out[r], o, me.recv_displs[p] + k, val(p, src + k));
                    }
                }
            }
            Coll::Gather if r == root => {
                (0..n * c).for_each(|j| put(&mut out[r], o, j, val(j / c, j % c)))
            }
            Coll::Gather => {}
            Coll::Scatter => (0..c).for_each(|j| put(&mut out[r], o, j, val(root, r * c + j))),
            Coll::SendRecv => (0..c).for_each(|j| put(&mut out[r], o, j, val((r + n - 1) % n, j))),
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(r, b)| (b, recv_off(r)))
        .collect()
}

#[test]
fn expected_outputs_match_a_host_model_of_every_operation() {
    for coll in Coll::ALL {
        for t in [
            DataType::Int8,
            DataType::Uint32,
            DataType::Float16,
            DataType::Float8e5m2,
            DataType::Float64,
        ] {
            let ops: Vec<Option<Redop>> = if coll.has_redop() {
                Redop::ALL.iter().map(|&r| Some(r)).collect()
            } else {
                vec![None]
            };
            for op in ops {
                for n in [1usize, 2, 3, 4] {
                    for in_place in [false, true] {
                        if in_place && !coll.in_place_checked() {
                            continue;
                        }
                        let root = if coll.has_root() { n - 1 } else { 0 };
                        let count = 97;
                        let gen = Gen::new(coll, t, op, n, 99);
                        let l = Layout::new(coll, count, n);
                        for (r, (buf, off)) in simulate(coll, t, op, n, root, count, in_place, &gen)
                            .into_iter()
                            .enumerate()
                        {
                            let ex = Expect::new(coll, gen.clone(), op, l, r, n, root, in_place);
                            let out = &buf[off..off + l.recv_count * t.size()];
                            let mut seen = Vec::new();
                            let wrong =
                                ex.count_wrong(out, 5, |j, w, g| seen.push((j, w, g.to_vec())));
                            assert_eq!(wrong, 0, "{coll:?} {t:?} {op:?} n={n} rank {r} in_place={in_place}: {seen:?}");
                            // And a corrupted element is caught.
                            if !out.is_empty() {
                                let mut bad = out.to_vec();
                                let j = bad.len() / t.size() / 2 * t.size();
                                bad[j] ^= 0x10;
                                assert_eq!(
                                    ex.count_wrong(&bad, 0, |_, _, _| {}),
                                    1,
                                    "{coll:?} {t:?} {op:?} n={n} rank {r}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn untouched_outputs_must_keep_the_poison() {
    // A non-root rank of reduce must leave its out-of-place receive buffer alone.
    let t = DataType::Float32;
    let l = Layout::new(Coll::Reduce, 10, 2);
    let g = Gen::new(Coll::Reduce, t, Some(Redop::Sum), 2, 1);
    let ex = Expect::new(Coll::Reduce, g, Some(Redop::Sum), l, 1, 2, 0, false);
    assert_eq!(ex.want(3), Want::Poison);
    let poison = vec![poison_byte(t); 40];
    assert_eq!(ex.count_wrong(&poison, 0, |_, _, _| {}), 0);
    let zeros = vec![0u8; 40];
    assert_eq!(ex.count_wrong(&zeros, 0, |_, _, _| {}), 10);
}

#[test]
fn signed_zero_is_not_a_mismatch() {
    let t = DataType::Float32;
    let l = Layout::new(Coll::Broadcast, 1, 1);
    let mut g = Gen::new(Coll::Broadcast, t, None, 1, 1);
    g.m = 0; // every value 0
    let ex = Expect::new(Coll::Broadcast, g, None, l, 0, 1, 0, false);
    assert_eq!(ex.count_wrong(&(-0.0f32).to_ne_bytes(), 0, |_, _, _| {}), 0);
    assert_eq!(ex.count_wrong(&f32::NAN.to_ne_bytes(), 0, |_, _, _| {}), 1);
}

// ---- C ABI marshalling ----------------------------------------------------------------------

fn call(coll: Coll, rank: usize, n: usize) -> Call {
    let l = Layout::new(coll, 64, n);
    Call {
        coll,
        send: 0x1000,
        recv: 0x9000,
        count: l.param_count,
        dtype: DataType::Float32,
        redop: Redop::Max,
        scalar: 1.0,
        root: 1,
        rank,
        nranks: n,
        vcounts: (coll == Coll::AlltoAllv).then(|| a2av_counts(l.param_count / n, n, rank)),
    }
}

#[test]
fn marshalling_of_the_collectives() {
    let f = DataType::Float32 as i32;
    assert_eq!(f, 7);
    assert_eq!(
        marshal(&call(Coll::AllReduce, 0, 4), 2, 1),
        vec![Prim::AllReduce {
            send: 0x1000,
            recv: 0x9000,
            count: 64,
            dtype: 7,
            op: 2
        }]
    );
    assert_eq!(
        marshal(&call(Coll::AllGather, 0, 4), 0, 1),
        vec![Prim::AllGather {
            send: 0x1000,
            recv: 0x9000,
            count: 16,
            dtype: 7
        }]
    );
    assert_eq!(
        marshal(&call(Coll::ReduceScatter, 0, 4), 5, 1),
        vec![Prim::ReduceScatter {
            send: 0x1000,
            recv: 0x9000,
            count: 16,
            dtype: 7,
            op: 5
        }]
    );
    assert_eq!(
        marshal(&call(Coll::Broadcast, 2, 4), 0, 1),
        vec![Prim::Broadcast {
            send: 0x1000,
            recv: 0x9000,
            count: 64,
            dtype: 7,
            root: 1
        }]
    );
    assert_eq!(
        marshal(&call(Coll::Reduce, 2, 4), 3, 1),
        vec![Prim::Reduce {
            send: 0x1000,
            recv: 0x9000,
            count: 64,
            dtype: 7,
            op: 3,
            root: 1
        }]
    );
    // Aggregated iterations share one group.
    let m = marshal(&call(Coll::AllReduce, 0, 4), 0, 3);
    assert_eq!(m.len(), 5);
    assert_eq!(
        (m[0].clone(), m[4].clone()),
        (Prim::GroupStart, Prim::GroupEnd)
    );
}

#[test]
fn marshalling_of_the_point_to_point_patterns() {
    use Prim::*;
    // SendRecv on rank 0 of 3: to 1, from 2.
    assert_eq!(
        marshal(&call(Coll::SendRecv, 0, 3), 0, 1),
        vec![
            GroupStart,
            Send {
                buf: 0x1000,
                count: 64,
                dtype: 7,
                peer: 1
            },
            Recv {
                buf: 0x9000,
                count: 64,
                dtype: 7,
                peer: 2
            },
            GroupEnd
        ]
    );
    // AlltoAll: 16 floats (64 bytes) per peer.
    let m = marshal(&call(Coll::AlltoAll, 1, 4), 0, 1);
    assert_eq!(m.len(), 10);
    assert_eq!(
        m[3],
        Send {
            buf: 0x1000 + 64,
            count: 16,
            dtype: 7,
            peer: 1
        }
    );
    assert_eq!(
        m[8],
        Recv {
            buf: 0x9000 + 192,
            count: 16,
            dtype: 7,
            peer: 3
        }
    );
    // Gather at the root (rank 1): one send, then a receive from every rank in order.
    let m = marshal(&call(Coll::Gather, 1, 4), 0, 1);
    assert_eq!(
        m[1],
        Send {
            buf: 0x1000,
            count: 16,
            dtype: 7,
            peer: 1
        }
    );
    assert_eq!(
        &m[2..6],
        &[0u64, 1, 2, 3].map(|p| Recv {
            buf: 0x9000 + p * 64,
            count: 16,
            dtype: 7,
            peer: p as i32
        })[..]
    );
    // Gather elsewhere: only the send.
    assert_eq!(
        marshal(&call(Coll::Gather, 2, 4), 0, 1),
        vec![
            GroupStart,
            Send {
                buf: 0x1000,
                count: 16,
                dtype: 7,
                peer: 1
            },
            GroupEnd
        ]
    );
    // Scatter at the root sends block p to p; everyone receives from the root.
    let m = marshal(&call(Coll::Scatter, 1, 4), 0, 1);
    assert_eq!(
        m[3],
        Send {
            buf: 0x1000 + 128,
            count: 16,
            dtype: 7,
            peer: 2
        }
    );
    assert_eq!(
        m[5],
        Recv {
            buf: 0x9000,
            count: 16,
            dtype: 7,
            peer: 1
        }
    );
    assert_eq!(
        marshal(&call(Coll::Scatter, 0, 4), 0, 1),
        vec![
            GroupStart,
            Recv {
                buf: 0x9000,
                count: 16,
                dtype: 7,
                peer: 1
            },
            GroupEnd
        ]
    );
    // AlltoAllv: the per-peer counts and packed displacements.
    let c = call(Coll::AlltoAllv, 2, 4);
    let v = c.vcounts.clone().unwrap();
    let m = marshal(&c, 0, 1);
    for p in 0..4 {
        assert_eq!(
            m[1 + 2 * p],
            Send {
                buf: 0x1000 + 4 * v.send_displs[p] as u64,
                count: v.send_counts[p],
                dtype: 7,
                peer: p as i32
            }
        );
        assert_eq!(
            m[2 + 2 * p],
            Recv {
                buf: 0x9000 + 4 * v.recv_displs[p] as u64,
                count: v.recv_counts[p],
                dtype: 7,
                peer: p as i32
            }
        );
    }
}

#[test]
fn unique_id_hex_round_trip() {
    let mut id = NcclUniqueId { internal: [0; 128] };
    for (i, b) in id.internal.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let h = id_to_hex(&id);
    assert_eq!(h.len(), 256);
    assert_eq!(&h[..6], "030a11");
    assert_eq!(id_from_hex(&h).unwrap().internal, id.internal);
    assert!(id_from_hex("abc").is_err());
    assert!(id_from_hex(&"zz".repeat(128)).is_err());
    assert_eq!(std::mem::size_of::<NcclUniqueId>(), 128);
}
