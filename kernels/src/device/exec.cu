// rustccl device code: the collective interpreter. One launch runs a whole group's work on one
// device: every work item (a ring or tree channel, a peer's sends, a peer's receives) is a list
// of steps the host planner built (host/src/coll/program.rs); the kernel walks them, moving
// data between the user's buffers and the FIFO slots of its connections, and synchronising
// with the peers through the FIFOs' counters. Nothing on the host takes part while it runs, so
// a launch can be captured in a CUDA graph and replayed.
//
// A FIFO (host/src/transport/fifo.rs) is STEPS slots of slot_bytes and a header: `head` (slots
// the consumer emptied), `tail` (slots the producer filled) and the wire size of each slot.
// Connection state lives only in those headers: a launch reads where it stands when it starts
// (the sender its tail, the receiver its head), so consecutive launches, and replays of a
// graph, carry on where the last one stopped.
//
// A step takes inputs from its receive connections (one slot each) and from `src` in user
// memory, combines them when REDUCE is set (pre-multiplying `src` for PreMulSum; POST applies
// SumPostDiv's division), and writes the result to `dst` and to one slot of every send
// connection. Slots hold the payload in one of three formats (the protocol of the step):
//   Simple  the payload as is; the consumer waits for `tail` (after a system fence).
//   LL      16-byte lines {data lo, flag, data hi, flag ^ h}: 8 payload bytes per line, flag =
//           slot index + 1; the consumer polls each line's flags, no fence on its path.
//   LL128   128-byte lines, 120 payload bytes and an 8-byte flag (slot index + 1 in the low
//           half, h in the high half); written and read by 8 threads of a warp in one
//           transaction each.
// h is a hash of the operation's signature (kind, type, operator, root, count: host
// coll::check::OpSig): lines another operation wrote never look ready, so ranks in different
// operations stop at the published signature check below instead of mixing their data.
// Consumers wait on the flags only over NVLink P2P, which delivers 128-byte lines whole and
// gives LL and LL128 slots of their own; on other connections (shared host memory, network)
// every protocol waits for `tail`.
// Every protocol also publishes `tail`, the wire size and the signature: the network proxy
// needs them, and the consumer checks them (a sender in another operation, or whose counts
// differ, is reported, not waited for).
//
// Errors and aborts: `control` is host memory the kernel polls (`abort`, set by the host on
// ncclCommAbort or a failure) and writes (`error`, with the connection, the expected and the
// received size) before stopping every block.
//
// Compiled once per (element type, operator) with -DRUSTCCL_EXEC_ELEM=<elem functor>
// -DRUSTCCL_EXEC_OP=<RUSTCCL_OP_*>; steps without REDUCE never touch the element type, so a
// launch of copies alone uses any instantiation. The kernel is `rustccl_exec`.
#include "port.h"
#include "elem.h"

#if !defined(RUSTCCL_EXEC_ELEM) || !defined(RUSTCCL_EXEC_OP)
#error "exec.cu is built with the -D options of rustccl_kernels::exec::exec_defines"
#endif

// Every constant and struct shared with the host (slots per FIFO, launch limits, step flags,
// protocols, connection flags, FIFO header offsets, error codes; RustcclExecStep, Item, Ctx,
// Conn, Control, Args and the u64/u32 typedefs) is defined once, in Rust
// (kernels/src/exec.rs), and generated into this header with static_asserts of every size and
// offset: nothing of it is defined here.
#include "rustccl_exec_abi.h"

// ---- Whole words of elements -------------------------------------------------------------
template <typename E, int Op>
struct RustcclWord {
  typedef typename E::Raw R;
  enum { N = 8 / sizeof(R) };
  union W {
    u64 u;
    R r[N];
  };
  static RUSTCCL_DEVICE u64 pre(u64 x, u64 scalar) {
    if (Op != RUSTCCL_OP_PREMULSUM) return x;
    W a;
    a.u = x;
#pragma unroll
    for (int i = 0; i < N; ++i) a.r[i] = E::mul(a.r[i], (R)scalar);
    return a.u;
  }
  static RUSTCCL_DEVICE u64 combine(u64 x, u64 y) {
    W a, b;
    a.u = x;
    b.u = y;
#pragma unroll
    for (int i = 0; i < N; ++i) a.r[i] = rustccl_combine<E, Op>(a.r[i], b.r[i]);
    return a.u;
  }
  static RUSTCCL_DEVICE u64 post(u64 x, u64 divisor) {
    if (Op != RUSTCCL_OP_SUMPOSTDIV) return x;
    W a;
    a.u = x;
#pragma unroll
    for (int i = 0; i < N; ++i) a.r[i] = E::div(a.r[i], divisor);
    return a.u;
  }
};
typedef RustcclWord<RUSTCCL_EXEC_ELEM, RUSTCCL_EXEC_OP> Word;

#include "memory.h"

// ---- One step, as every thread of the block sees it -------------------------------------
struct StepView {
  const unsigned char* src;  // null without SRC
  unsigned char* dst;        // null without DST
  u64 recv[RUSTCCL_EXEC_MAX_PEERS];
  u64 send[RUSTCCL_EXEC_MAX_PEERS];
  u64 rflag[RUSTCCL_EXEC_MAX_PEERS];
  u64 sflag[RUSTCCL_EXEC_MAX_PEERS];
  u64 scalar, divisor;
  u32 bytes;
  u32 flags;
  u32 h;                     // the operation's signature hash, folded into LL/LL128 flags
  int nrecv, nsend;
  const volatile u32* abort;
};

// The signature folded into line flags: equal signatures give equal hashes.
RUSTCCL_DEVICE u32 sig_hash(u64 sig) { return (u32)((sig * 0x9E3779B97F4A7C15ull) >> 32); }

// An LL128 line's flag for slot position `p` (the low half tells slot uses apart).
RUSTCCL_DEVICE u64 ll128_flag(u64 p, u32 h) { return ((p + 1) & 0xffffffffull) | ((u64)h << 32); }

// The step's result for one word from its NR received words and the source word `s`.
template <int NR>
RUSTCCL_DEVICE u64 compute(const StepView& v, const u64 (&in)[NR > 0 ? NR : 1], u64 s) {
  if (!(v.flags & RUSTCCL_STEP_REDUCE)) return (NR == 0 || (v.flags & RUSTCCL_STEP_SRC)) ? s : in[0];
  u64 acc = NR > 0 ? in[0] : 0;
  if (v.flags & RUSTCCL_STEP_SRC) {
    const u64 p = Word::pre(s, v.scalar);
    acc = NR > 0 ? Word::combine(acc, p) : p;
  }
#pragma unroll
  for (int k = 1; k < NR; ++k) acc = Word::combine(acc, in[k]);
  if (v.flags & RUSTCCL_STEP_POST) acc = Word::post(acc, v.divisor);
  return acc;
}

#include "proto_simple.h"
#include "proto_ll.h"
#include "proto_ll128.h"

// The step's data movement, for a protocol and compile-time peer counts, in an entry point
// built for the protocols in PROTOS (a bit per protocol, 1 << its number). -1: a protocol the entry
// was not built for (the host never launches one so; reported, not run).
#define RUSTCCL_HAS(PROTOS, P) (((PROTOS) >> (P)) & 1u)
template <u32 PROTOS, int NR, int NS>
RUSTCCL_DEVICE int run_proto(const StepView& v, int proto, bool lines_whole) {
  constexpr bool MIXED = (PROTOS & (PROTOS - 1)) != 0;
  if (RUSTCCL_HAS(PROTOS, RUSTCCL_PROTO_LL) && proto == RUSTCCL_PROTO_LL) return run_ll<NR, NS, MIXED>(v);
  if (RUSTCCL_HAS(PROTOS, RUSTCCL_PROTO_LL128) && proto == RUSTCCL_PROTO_LL128) return run_ll128<NR, NS, MIXED>(v, lines_whole);
  if (RUSTCCL_HAS(PROTOS, RUSTCCL_PROTO_SIMPLE) && proto == RUSTCCL_PROTO_SIMPLE) return run_simple<NR, NS>(v);
  return -1;
}

// 1 done, 0 aborted, -1 a protocol the entry point lacks.
template <u32 PROTOS>
RUSTCCL_DEVICE int run_step(const StepView& v, int proto, bool lines_whole) {
  switch (v.nrecv * 3 + v.nsend) {
    case 0: return run_proto<PROTOS, 0, 0>(v, proto, lines_whole);
    case 1: return run_proto<PROTOS, 0, 1>(v, proto, lines_whole);
    case 2: return run_proto<PROTOS, 0, 2>(v, proto, lines_whole);
    case 3: return run_proto<PROTOS, 1, 0>(v, proto, lines_whole);
    case 4: return run_proto<PROTOS, 1, 1>(v, proto, lines_whole);
    case 5: return run_proto<PROTOS, 1, 2>(v, proto, lines_whole);
    case 6: return run_proto<PROTOS, 2, 0>(v, proto, lines_whole);
    case 7: return run_proto<PROTOS, 2, 1>(v, proto, lines_whole);
    default: return run_proto<PROTOS, 2, 2>(v, proto, lines_whole);
  }
}

// A copy within user memory whose source and destination overlap (memmove), a block-wide
// chunk at a time, in the direction that reads every byte before it is overwritten.
RUSTCCL_DEVICE void run_memmove(const StepView& v) {
  const u64 n = v.bytes, chunk = (u64)blockDim.x * 8;
  const u64 chunks = (n + chunk - 1) / chunk;
  const bool backward = v.dst > v.src;
  for (u64 i = 0; i < chunks; ++i) {
    const u64 c = backward ? chunks - 1 - i : i;
    const u64 off = c * chunk + (u64)threadIdx.x * 8;
    const u32 valid = off < n ? (u32)min((u64)8, n - off) : 0;
    const u64 x = valid ? load_user(v.src + off, valid) : 0;
    __syncthreads();
    if (valid) store_user(v.dst + off, x, valid);
    __syncthreads();
  }
}

RUSTCCL_DEVICE u64 wire_bytes(int proto, u64 bytes) {
  const u64 words = (bytes + 7) / 8;
  if (proto == RUSTCCL_PROTO_LL) return words * 16;
  if (proto == RUSTCCL_PROTO_LL128) return (words + 14) / 15 * 128;
  return bytes;
}

// Whether the consumer may wait on the lines' flags rather than on `tail`.
RUSTCCL_DEVICE bool flags_trusted(const RustcclExecConn& c, int proto) {
  return proto != RUSTCCL_PROTO_SIMPLE && (c.flags & RUSTCCL_CONN_LINES_WHOLE);
}

// Slots of this protocol's kind on the connection: the producer may run this many ahead.
RUSTCCL_DEVICE u64 proto_steps(const RustcclExecConn& c, int proto) {
  return flags_trusted(c, proto) ? RUSTCCL_EXEC_STEPS : (u64)c.simple_steps;
}

RUSTCCL_DEVICE u64 slot_addr(const RustcclExecConn& c, u64 pos, int proto) {
  if (flags_trusted(c, proto)) {
    const u64 i = pos % RUSTCCL_EXEC_STEPS;
    return proto == RUSTCCL_PROTO_LL ? c.ll_slots + i * c.ll_slot_bytes : c.ll128_slots + i * c.ll128_slot_bytes;
  }
  // simple_steps is a power of two (the host checks it): a mask, not a 64-bit division.
  return c.slots + (pos & (u64)(c.simple_steps - 1)) * c.slot_bytes;
}

RUSTCCL_DEVICE u64 slot_capacity(const RustcclExecConn& c, int proto) {
  if (flags_trusted(c, proto)) return proto == RUSTCCL_PROTO_LL ? c.ll_slot_bytes : c.ll128_slot_bytes;
  return c.slot_bytes;
}

// Records an error of the launch (its details first, then the code the host polls) and stops
// every block.
RUSTCCL_DEVICE void report(RustcclExecControl* control, u32 code, u32 conn, u64 expected, u64 got) {
  *(volatile u32*)&control->conn = conn;
  *(volatile u64*)&control->expected = expected;
  *(volatile u64*)&control->got = got;
  __threadfence_system();
  atomicCAS_system((unsigned int*)&control->error, 0u, code);
  *(volatile u32*)&control->abort = 1;
}

// Whether slot `p` of receive connection `ci`, published, comes from the same operation (its
// signature, when both sides give one) and holds the `wire` bytes this step expects; reports
// the mismatch when not. `*direct`: the sender wrote the step straight into this rank's
// buffer (allowed only where `may_direct`: a plain receive into a posted buffer).
RUSTCCL_DEVICE bool published_size_ok(const RustcclExecConn& c, int ci, u64 p, u64 wire, u64 sig, RustcclExecControl* control,
                                      bool may_direct, bool* direct) {
  const u64 theirs = ld_volatile_u64(c.header + RUSTCCL_FIFO_SIGS + (p % RUSTCCL_EXEC_STEPS) * 8);
  if (sig != 0 && theirs != 0 && theirs != sig) {
    report(control, RUSTCCL_EXEC_ERR_SIG, ci, sig, theirs);
    return false;
  }
  u64 size = ld_volatile_u64(c.header + RUSTCCL_FIFO_SIZES + (p % RUSTCCL_EXEC_STEPS) * 8);
  *direct = (size & RUSTCCL_FIFO_SIZE_DIRECT) != 0;
  if (*direct && !may_direct) {
    report(control, RUSTCCL_EXEC_ERR_SIZE, ci, wire, size);
    return false;
  }
  size &= ~RUSTCCL_FIFO_SIZE_DIRECT;
  // UNREPORTED: the network plugin did not say how much it received; the step's size holds.
  if (size == wire || size == RUSTCCL_FIFO_SIZE_UNREPORTED) return true;
  report(control, RUSTCCL_EXEC_ERR_SIZE, ci, wire, size);
  return false;
}

// ---- Zero-copy receives (ncclCommRegister) -----------------------------------------------
// A receiver whose buffer the sender's process maps (`dst_remote`) posts, for each run of
// plain receive steps of one operation on a P2P connection, the run's first position and
// length, that address and its signature in the FIFO header. A sender whose plain Simple send
// step falls in a post with its own signature writes the payload there instead of into the
// slot, and marks the slot's published size FIFO_SIZE_DIRECT; the receiver then has nothing
// to copy. Each side decides per step from what it sees, so neither waits for the other: steps
// sent before the post arrived go through the slots as usual.

// Steps smaller than this are not worth the sender's read of the post across the link.
#define RUSTCCL_DIRECT_MIN_BYTES (64u << 10)

RUSTCCL_DEVICE bool plain_recv(const RustcclExecStep& st) {
  return st.nrecv == 1 && st.nsend == 0 && st.proto == RUSTCCL_PROTO_SIMPLE &&
         (st.flags & (RUSTCCL_STEP_SRC | RUSTCCL_STEP_DST | RUSTCCL_STEP_REDUCE)) == RUSTCCL_STEP_DST;
}
RUSTCCL_DEVICE bool plain_send(const RustcclExecStep& st) {
  return st.nsend == 1 && st.nrecv == 0 && st.proto == RUSTCCL_PROTO_SIMPLE && st.bytes >= RUSTCCL_DIRECT_MIN_BYTES &&
         (st.flags & (RUSTCCL_STEP_SRC | RUSTCCL_STEP_DST | RUSTCCL_STEP_REDUCE | RUSTCCL_STEP_SRC_IN_DST)) == RUSTCCL_STEP_SRC;
}

// Thread 0 of the receiver: posts steps [first, first + n) of an operation with signature
// `sig` whose message starts at `base` in the sender's process. The tag goes first and last
// (a reader that sees both equal read one post whole).
RUSTCCL_DEVICE void post_direct(u64 header, u64 first, u32 n, u64 base, u64 sig) {
  const u64 tag = (first << 16) | n;
  st_volatile_u64(header + RUSTCCL_FIFO_DIRECT, tag);
  __threadfence_system();
  st_volatile_u64(header + RUSTCCL_FIFO_DIRECT + 8, base);
  st_volatile_u64(header + RUSTCCL_FIFO_DIRECT + 16, sig);
  __threadfence_system();
  st_volatile_u64(header + RUSTCCL_FIFO_DIRECT + 24, tag);
}

// A post as the sender last read it.
struct DirectPost {
  u64 tag, base, sig;
};

RUSTCCL_DEVICE bool tag_covers(u64 tag, u64 p) {
  const u64 first = tag >> 16, n = tag & 0xffff;
  return p >= first && p < first + n;
}
RUSTCCL_DEVICE bool post_covers(const DirectPost& d, u64 p, u64 sig) {
  return d.base != 0 && sig != 0 && d.sig == sig && tag_covers(d.tag, p);
}

// Thread 0 of the sender: where step `st` at position `p` of an operation with signature
// `sig` goes in the receiver's buffer, or 0 to use the slot. `cached` is the last post read.
RUSTCCL_DEVICE u64 direct_target(DirectPost& cached, u64 header, u64 p, const RustcclExecStep& st, u64 sig) {
  if (!post_covers(cached, p, sig)) {
    // The tag written last first: one remote load when no post covers the step.
    const u64 last = ld_volatile_u64(header + RUSTCCL_FIFO_DIRECT + 24);
    if (!tag_covers(last, p)) return 0;
    DirectPost d;
    d.tag = last;
    __threadfence_system();
    d.base = ld_volatile_u64(header + RUSTCCL_FIFO_DIRECT + 8);
    d.sig = ld_volatile_u64(header + RUSTCCL_FIFO_DIRECT + 16);
    __threadfence_system();
    if (ld_volatile_u64(header + RUSTCCL_FIFO_DIRECT) != last) return 0;  // a newer post meanwhile
    cached = d;
    if (!post_covers(cached, p, sig)) return 0;
  }
  return cached.base + st.src;
}

// LL128 consumers start on a slot when its first line is there, and chase the sender through
// the rest; -DRUSTCCL_LL128_WAIT_TAIL=1 (for experiments) makes them wait for the whole slot.
#ifndef RUSTCCL_LL128_WAIT_TAIL
#define RUSTCCL_LL128_WAIT_TAIL 0
#endif

// Thread 0: whether every input of the step has arrived and every output slot is free.
// 1 ready, 0 not yet, -1 stop (error reported).
// `*direct`: bit k set when receive k was written into this rank's buffer by its sender
// (possible only where `may_direct`).
RUSTCCL_DEVICE int step_ready(const RustcclExecStep& st, const RustcclExecConn* conns, u64* pos, u64* seen,
                              RustcclExecControl* control, u32 idle, u64 sig, bool may_direct, u32* direct) {
  *direct = 0;
  const u64 wire = wire_bytes(st.proto, st.bytes);
  const u32 h = sig_hash(sig);
  for (int k = 0; k < st.nrecv; ++k) {
    const int ci = st.recv[k];
    const RustcclExecConn& c = conns[ci];
    const u64 p = pos[ci];
    if (wire > 0 && flags_trusted(c, st.proto) && !(RUSTCCL_LL128_WAIT_TAIL && st.proto == RUSTCCL_PROTO_LL128)) {
      // The sender has started this slot (its first line is there): it finishes it without
      // waiting for anything else, so the lines can be waited for.
      const u64 slot = slot_addr(c, p, st.proto);
      bool started;
      if (st.proto == RUSTCCL_PROTO_LL) {
        u32 a, b, cc, d;
        ld_volatile_v4(slot, a, b, cc, d);
        started = b == (u32)(p + 1) && d == ((u32)(p + 1) ^ h);
      } else {
        started = ld_volatile_u64(slot + 120) == ll128_flag(p, h);
      }
      if (started) continue;
      // Not started for a while: a sender whose step has another size, or that runs
      // another operation, never writes this line as expected; what it published tells.
      if ((idle & 63) != 63) return 0;
      seen[ci] = ld_volatile_u64(c.header + RUSTCCL_FIFO_TAIL);
      if (seen[ci] <= p) return 0;
      bool unused;
      return published_size_ok(c, ci, p, wire, sig, control, false, &unused) ? 0 : -1;
    }
    if (seen[ci] <= p) {
      seen[ci] = ld_volatile_u64(c.header + RUSTCCL_FIFO_TAIL);
      if (seen[ci] <= p) return 0;
    }
    bool d = false;
    if (!published_size_ok(c, ci, p, wire, sig, control, may_direct, &d)) return -1;
    if (d) {
      // The sender's stores into this rank's buffer came before its tail (a system fence):
      // order them before everything this launch and later work do.
      __threadfence();
      *direct |= 1u << k;
    }
  }
  for (int k = 0; k < st.nsend; ++k) {
    const int ci = st.send[k];
    const RustcclExecConn& c = conns[ci];
    if (wire > slot_capacity(c, st.proto)) {
      report(control, RUSTCCL_EXEC_ERR_SIZE, ci, slot_capacity(c, st.proto), wire);
      return -1;
    }
    const u64 window = proto_steps(c, st.proto);
    if (pos[ci] - seen[ci] >= window) {
      seen[ci] = ld_volatile_u64(c.header + RUSTCCL_FIFO_HEAD);
      if (pos[ci] - seen[ci] >= window) return 0;
    }
  }
  return 1;
}

// Operation context `i` of the launch (its buffers, scalar, divisor, signature).
RUSTCCL_DEVICE RustcclExecCtx exec_ctx(const RustcclExecArgs& args, u32 i) {
  RustcclExecCtx c = ((const RustcclExecCtx*)args.ctxs)[i];
  // The first ncalls contexts take their per-call values from the kernel parameter.
  if (i < args.ncalls) {
    const RustcclExecCall& call = args.calls[i];
    c.src = call.src;
    c.dst = call.dst;
    c.scalar = call.scalar;
    c.scalar_ptr = call.scalar_ptr;
    c.dst_remote = call.dst_remote;
  }
  return c;
}

// What a step publishes when its data is done (see post_step): recorded by thread 0 when it
// builds the step's view, carried out by the posting thread after the block barrier while
// thread 0 looks for the next step.
struct PostRecord {
  u64 send_header[RUSTCCL_EXEC_MAX_PEERS], send_pos[RUSTCCL_EXEC_MAX_PEERS];
  u64 recv_header[RUSTCCL_EXEC_MAX_PEERS], recv_pos[RUSTCCL_EXEC_MAX_PEERS];
  u64 sig, wire;
  int nsend, nrecv;
  int fence;
  int direct;  // the (one) send went straight into the receiver's buffer
};

// Connections kept in shared memory (launches with more read the rest from the image).
constexpr u32 CONN_CACHE = 32;

// What the block shares: the step the threads run next (built by thread 0), and thread 0's
// bookkeeping of where every connection and work item stands.
struct BlockState {
  StepView view;
  u64 pos[RUSTCCL_EXEC_MAX_CONNS];
  u64 seen[RUSTCCL_EXEC_MAX_CONNS];  // recv: tail seen; send: head seen
  u32 pc[RUSTCCL_EXEC_MAX_ITEMS];
  RustcclExecItem items[RUSTCCL_EXEC_MAX_ITEMS];
  RustcclExecConn conn[CONN_CACHE];  // the launch's first connections
  RustcclExecStep step;  // the step in `view`
  alignas(16) RustcclExecStep pf;  // thread 0's: the item's next step, loaded ahead
  PostRecord posts[2];   // per round (parity): what the step publishes when done
  RustcclExecCtx ctx;    // thread 0's: the operation context read last
  u32 ctx_index;         // its index (~0: none yet)
  u32 item;              // its work item (index among the block's)
  u32 posted[RUSTCCL_EXEC_MAX_ITEMS];      // per item: 1 + the step whose run was posted last (0: none)
  DirectPost dpost[RUSTCCL_EXEC_MAX_ITEMS];  // per item: the receiver's post its sends read last
  u32 rdirect;           // the chosen step's receives its senders wrote straight into `dst`
  int ready[2];          // per round (parity): 1 run `view`, 0 all done, -1 stop
  int stop;              // set by any thread whose data movement was aborted
};

// Thread 0: the step's view (slot addresses, flags, buffers) for every thread.
// `direct_dst`: a send going straight into the receiver's buffer there (not the slot);
// `rdirect`: receives whose senders did so (nothing to copy).
RUSTCCL_DEVICE void build_view(StepView& v, const RustcclExecStep& st, const RustcclExecCtx& cx, const RustcclExecArgs& args,
                               const RustcclExecConn* conns, const u64* pos, u64 direct_dst, u32 rdirect) {
  v.src = (st.flags & RUSTCCL_STEP_SRC)
              ? (const unsigned char*)(((st.flags & RUSTCCL_STEP_SRC_IN_DST) ? cx.dst : cx.src) + st.src)
              : 0;
  v.dst = (st.flags & RUSTCCL_STEP_DST) ? (unsigned char*)(cx.dst + st.dst) : 0;
  v.nrecv = st.nrecv;
  v.nsend = st.nsend;
  v.h = sig_hash(cx.sig);
  const bool ll128 = st.proto == RUSTCCL_PROTO_LL128;
  for (int k = 0; k < RUSTCCL_EXEC_MAX_PEERS; ++k) {
    v.recv[k] = v.send[k] = v.rflag[k] = v.sflag[k] = 0;
    if (k < st.nrecv) {
      const u64 p = pos[st.recv[k]];
      v.recv[k] = slot_addr(conns[st.recv[k]], p, st.proto);
      v.rflag[k] = ll128 ? ll128_flag(p, v.h) : p + 1;
    }
    if (k < st.nsend) {
      const u64 p = pos[st.send[k]];
      v.send[k] = slot_addr(conns[st.send[k]], p, st.proto);
      v.sflag[k] = ll128 ? ll128_flag(p, v.h) : p + 1;
    }
  }
  // A scalar in device memory is read now, when the operation runs (the caller's stream
  // wrote it before; a replayed graph reads each replay's value).
  v.scalar = cx.scalar_ptr ? (u64)*(const volatile typename RUSTCCL_EXEC_ELEM::Raw*)cx.scalar_ptr : cx.scalar;
  v.divisor = cx.divisor;
  v.bytes = st.bytes;
  v.flags = st.flags;
  v.abort = &((RustcclExecControl*)args.control)->abort;
  if (direct_dst) {
    // A plain send (plain_send): a copy from `src` into the receiver's buffer.
    v.dst = (unsigned char*)direct_dst;
    v.flags |= RUSTCCL_STEP_DST;
    v.nsend = 0;
    v.send[0] = 0;
  }
  if (rdirect) {
    // A plain receive (plain_recv) already in `dst`: nothing to move.
    v.nrecv = 0;
    v.recv[0] = 0;
    v.src = 0;
    v.dst = 0;
    v.flags &= ~RUSTCCL_STEP_DST;
  }
}

// Thread 0, when it builds a step's view: what the step publishes when its data is done
// (`rec`), and the connections' positions after it. Sends get the signature, wire size and
// `tail`; where the consumer reads the data because of `tail` (a Simple slot, an LL128 slot
// whose lines may arrive split, the network proxy) one system fence first orders the whole
// block's stores before it. Receives give their slot back through `head`.
RUSTCCL_DEVICE void record_post(PostRecord& rec, const RustcclExecStep& st, const RustcclExecConn* conns, u64 sig, u64* pos,
                                 bool direct) {
  rec.sig = sig;
  rec.direct = direct;
  rec.wire = wire_bytes(st.proto, st.bytes);
  rec.nsend = st.nsend;
  rec.nrecv = st.nrecv;
  rec.fence = 0;
  for (int k = 0; k < st.nsend; ++k) {
    const RustcclExecConn& c = conns[st.send[k]];
    rec.fence |= !flags_trusted(c, st.proto);
    rec.send_header[k] = c.header;
    rec.send_pos[k] = pos[st.send[k]]++;
  }
  for (int k = 0; k < st.nrecv; ++k) {
    rec.recv_header[k] = conns[st.recv[k]].header;
    rec.recv_pos[k] = pos[st.recv[k]]++;
  }
}

// The posting thread, after every thread finished the step's data (a block barrier since):
// publishes it as `rec` says.
RUSTCCL_DEVICE void post_step(const PostRecord& rec) {
  for (int k = 0; k < rec.nsend; ++k) {
    const u64 slot = rec.send_pos[k] % RUSTCCL_EXEC_STEPS;
    st_volatile_u64(rec.send_header[k] + RUSTCCL_FIFO_SIGS + slot * 8, rec.sig);
    st_volatile_u64(rec.send_header[k] + RUSTCCL_FIFO_SIZES + slot * 8, rec.wire | (rec.direct ? RUSTCCL_FIFO_SIZE_DIRECT : 0));
  }
  if (rec.fence) rustccl_fence_release_sys();
  for (int k = 0; k < rec.nsend; ++k) st_volatile_u64(rec.send_header[k] + RUSTCCL_FIFO_TAIL, rec.send_pos[k] + 1);
  for (int k = 0; k < rec.nrecv; ++k) st_volatile_u64(rec.recv_header[k] + RUSTCCL_FIFO_HEAD, rec.recv_pos[k] + 1);
}

// Thread 0: operation context `i`, read from the launch only when it differs from the last.
RUSTCCL_DEVICE const RustcclExecCtx& block_ctx(BlockState& b, const RustcclExecArgs& args, u32 i) {
  if (b.ctx_index != i) {
    b.ctx = exec_ctx(args, i);
    b.ctx_index = i;
  }
  return b.ctx;
}

// Thread 0: the next step of the block's work items that can run, in turn (a block with
// several items must not wait on one while another could move: the peers may be waiting for
// that one). Spins without the other threads until one is ready (1), every item is done (0)
// or the launch stops (-1: an error reported, or an abort).
// `pf` is the step (item `pf_j`, position `pf_pc`) thread 0 loaded ahead while the block ran
// the previous one.
RUSTCCL_DEVICE int next_ready(BlockState& b, const RustcclExecArgs& args, u32 mine, u32& turn, const RustcclExecStep& pf,
                              u32 pf_j, u32 pf_pc, const RustcclExecConn* conns) {
  const RustcclExecStep* steps = (const RustcclExecStep*)args.steps;
  RustcclExecControl* control = (RustcclExecControl*)args.control;
  rustccl_copy_wait();  // `pf`, copied in the background since the last step was found
  for (u32 idle = 0;; ++idle) {
    bool left = false;
    for (u32 n = 0; n < mine; ++n) {
      const u32 j = (turn + n) % mine;
      if (b.pc[j] >= b.items[j].count) continue;
      left = true;
      // By reference: step_ready indexes its peers at run time, which a copy would put in
      // local memory.
      const RustcclExecStep& st = (j == pf_j && b.pc[j] == pf_pc) ? pf : steps[b.items[j].first + b.pc[j]];
      const RustcclExecCtx& cx = block_ctx(b, args, st.ctx);
      bool may_direct = false;
      if (cx.dst_remote != 0 && plain_recv(st) && (conns[st.recv[0]].flags & RUSTCCL_CONN_DIRECT)) {
        may_direct = true;
        // The first step of a run: post the run before waiting for it, so the sender can
        // write it straight into this rank's buffer.
        if ((st.flags & RUSTCCL_STEP_DIRECT_START) && b.posted[j] != b.pc[j] + 1) {
          post_direct(conns[st.recv[0]].header, b.pos[st.recv[0]], st.run, cx.dst_remote, cx.sig);
          b.posted[j] = b.pc[j] + 1;
        }
      }
      u32 rdirect;
      const int r = step_ready(st, conns, b.pos, b.seen, control, idle, cx.sig, may_direct, &rdirect);
      if (r < 0) return -1;
      if (r == 0) continue;
      b.rdirect = rdirect;
      b.step = st;
      b.item = j;
      turn = (j + 1) % mine;
      return 1;
    }
    if (!left) return 0;
    if ((idle & 1023) == 1023 && *(volatile u32*)&control->abort) return -1;
  }
}

// Where a block's time goes, for kernel work (-DRUSTCCL_KERNEL_TIMING=1 through
// RUSTCCL_KERNEL_DEFINES; never in a normal build): thread 0 counts clock cycles spent waiting
// for a ready step, building its view, between the two block barriers (the block's data
// movement) and on its bookkeeping after them ("post": the posting thread publishes the step
// meanwhile), and prints them when the block ends.
#ifdef RUSTCCL_KERNEL_TIMING
#define RUSTCCL_TIMED(...) __VA_ARGS__
struct StepTiming {
  long long wait, view, data, post;
  unsigned long long steps, bytes, start_ns;
};
RUSTCCL_DEVICE unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
RUSTCCL_DEVICE void print_timing(const StepTiming& t) {
  printf("RUSTCCL_KERNEL_TIMING block %u steps %llu bytes %llu ns %llu cycles wait %lld view %lld data %lld post %lld\n", blockIdx.x,
         t.steps, t.bytes, global_ns() - t.start_ns, t.wait, t.view, t.data, t.post);
}
#else
#define RUSTCCL_TIMED(...)
#endif

template <u32 PROTOS>
RUSTCCL_DEVICE void exec_block(const RustcclExecArgs& args) {
  __shared__ BlockState b;
  const RustcclExecConn* image_conns = (const RustcclExecConn*)args.conns;
  const RustcclExecConn* conns = args.nconns <= CONN_CACHE ? b.conn : image_conns;
  const u32 tid = threadIdx.x;
  RUSTCCL_TIMED(StepTiming timing = {0, 0, 0, 0, 0, 0, global_ns()}; long long clk = 0;)

  for (u32 i = tid; i < args.nconns; i += blockDim.x) {
    const RustcclExecConn c = image_conns[i];
    if (i < CONN_CACHE) b.conn[i] = c;
    const bool send = c.flags & RUSTCCL_CONN_SEND;
    b.pos[i] = ld_volatile_u64(c.header + (send ? RUSTCCL_FIFO_TAIL : RUSTCCL_FIFO_HEAD));
    b.seen[i] = send ? ld_volatile_u64(c.header + RUSTCCL_FIFO_HEAD) : b.pos[i];
  }
  u32 mine = 0;
  for (u32 i = blockIdx.x; i < args.nitems && mine < RUSTCCL_EXEC_MAX_ITEMS; i += gridDim.x) ++mine;
  if (tid < mine) {
    b.items[tid] = ((const RustcclExecItem*)args.items)[blockIdx.x + tid * gridDim.x];
    b.pc[tid] = 0;
    b.posted[tid] = 0;
    b.dpost[tid].tag = b.dpost[tid].base = b.dpost[tid].sig = 0;
  }
  if (tid == 0) {
    b.stop = 0;
    b.ctx_index = ~0u;
  }
  // The thread that publishes finished steps, while thread 0 looks for the next.
  const u32 poster = blockDim.x > 32 ? 32 : 0;
  __syncthreads();

  // Thread 0 finds a ready step and builds its view while the others wait at the barrier;
  // all run its data; after a second barrier thread 0 publishes it and looks for the next.
  // Two block barriers per step, one system fence (thread 0's) where the consumer needs it.
  u32 turn = 0, pf_j = ~0u, pf_pc = 0;
  RustcclExecStep& pf = b.pf;
  for (u32 round = 0;; ++round) {
    if (tid == 0) {
      RUSTCCL_TIMED(clk = clock64();)
      const int r = next_ready(b, args, mine, turn, pf, pf_j, pf_pc, conns);
      RUSTCCL_TIMED(timing.wait += clock64() - clk; clk = clock64();)
      if (r > 0) {
        if (b.rdirect) {
          volatile u32* n = &((RustcclExecControl*)args.control)->direct_steps;
          *n = *n + 1;
        }
        const RustcclExecCtx& cx = block_ctx(b, args, b.step.ctx);
        u64 direct_dst = 0;
        if (plain_send(b.step) && (conns[b.step.send[0]].flags & RUSTCCL_CONN_DIRECT)) {
          const int ci = b.step.send[0];
          direct_dst = direct_target(b.dpost[b.item], conns[ci].header, b.pos[ci], b.step, cx.sig);
        }
        build_view(b.view, b.step, cx, args, conns, b.pos, direct_dst, b.rdirect);
        record_post(b.posts[round & 1], b.step, conns, cx.sig, b.pos, direct_dst != 0);
        // The item's next step, loaded now: used after this one, its load is hidden.
        const u32 j = b.item, next = b.pc[j] + 1;
        pf_j = ~0u;
        if (next < b.items[j].count) {
          // In the background: thread 0 goes on to the barrier without waiting for it.
          rustccl_copy32_async(&b.pf, (const RustcclExecStep*)args.steps + b.items[j].first + next);
          pf_j = j;
          pf_pc = next;
        }
      }
      b.ready[round & 1] = r;
      RUSTCCL_TIMED(timing.view += clock64() - clk;)
    }
    __syncthreads();
    RUSTCCL_TIMED(if (tid == 0) clk = clock64();)
    const int ready = b.ready[round & 1];
    if (ready <= 0) {
      RUSTCCL_TIMED(if (tid == 0) print_timing(timing);)
      return;
    }
    const StepView& v = b.view;  // shared: the data loops take their own copies
    const bool local = v.nrecv == 0 && v.nsend == 0;
    const bool overlap = v.src && v.dst && v.src != v.dst && v.src < v.dst + v.bytes && v.dst < v.src + v.bytes;
    const int proto = b.step.proto;
    int done = 1;
    if (local && !(v.flags & RUSTCCL_STEP_REDUCE) && (v.src == v.dst || overlap)) {
      if (overlap) run_memmove(v);
    } else {
      bool trusted = true;
      for (int k = 0; k < v.nrecv; ++k) trusted = trusted && flags_trusted(conns[b.step.recv[k]], proto);
      done = run_step<PROTOS>(v, proto, trusted);
    }
    if (done < 0 && tid == 0) report((RustcclExecControl*)args.control, RUSTCCL_EXEC_ERR_PROTO, 0, PROTOS, proto);
    if (done <= 0) b.stop = 1;
    __syncthreads();
    if (b.stop) {
      if (tid == 0) rustccl_copy_wait();
      return;
    }
    if (tid == poster) post_step(b.posts[round & 1]);
    if (tid == 0) {
      RUSTCCL_TIMED(timing.data += clock64() - clk; timing.steps += 1; timing.bytes += v.bytes; clk = clock64();)
      b.pc[b.item] += 1;
      RUSTCCL_TIMED(timing.post += clock64() - clk;)
    }
  }
}

// The entry points (rustccl_kernels::exec::ExecEntry): every protocol, and one per protocol.
#define RUSTCCL_ENTRY(NAME, PROTOS)                                                     \
  extern "C" __global__ void __launch_bounds__(RUSTCCL_EXEC_THREADS)                    \
      NAME(RUSTCCL_GRID_CONSTANT const RustcclExecArgs args) {                          \
    exec_block<PROTOS>(args);                                                           \
  }
RUSTCCL_ENTRY(rustccl_exec, (1u << RUSTCCL_PROTO_SIMPLE) | (1u << RUSTCCL_PROTO_LL) | (1u << RUSTCCL_PROTO_LL128))
RUSTCCL_ENTRY(rustccl_exec_simple, 1u << RUSTCCL_PROTO_SIMPLE)
RUSTCCL_ENTRY(rustccl_exec_ll, 1u << RUSTCCL_PROTO_LL)
RUSTCCL_ENTRY(rustccl_exec_ll128, 1u << RUSTCCL_PROTO_LL128)

// The symmetric kernels (peers' windows, no FIFO), built for the same operator and type.
#include "symmetric.h"
