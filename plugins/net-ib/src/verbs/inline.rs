//! The verbs that verbs.h defines as `static inline` functions: they are not exported by
//! libibverbs, and a C program calls the provider's function straight through the
//! context's ops table (`qp->context->ops.post_send(...)`). These do the same.

use std::ffi::c_int;

use super::types::*;

/// `ibv_post_send`: hands a chain of send work requests to the QP's provider. Returns 0 or
/// an errno value, with `*bad_wr` set to the first request not posted.
///
/// # Safety
/// `qp` is a live QP of an open context; `wr` is a valid chain whose SGEs and remote keys
/// stay valid as the verbs contract says (until completion, inline data until return).
pub unsafe fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller's promise: `qp` and its context are live.
    let ops = unsafe { &(*(*qp).context).ops };
    match ops.post_send {
        // SAFETY: the provider's function for this QP, with the caller's valid arguments.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_recv`: hands a chain of receive work requests to the QP's provider. Returns 0
/// or an errno value, with `*bad_wr` set to the first request not posted.
///
/// # Safety
/// As [`post_send`], for receive requests.
pub unsafe fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's promise: `qp` and its context are live.
    let ops = unsafe { &(*(*qp).context).ops };
    match ops.post_recv {
        // SAFETY: the provider's function for this QP, with the caller's valid arguments.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_poll_cq`: moves up to `num_entries` completions into `wc`. Returns how many (0 when
/// none is ready) or a negative value on error.
///
/// # Safety
/// `cq` is a live CQ of an open context; `wc` has room for `num_entries` entries.
pub unsafe fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's promise: `cq` and its context are live.
    let ops = unsafe { &(*(*cq).context).ops };
    match ops.poll_cq {
        // SAFETY: the provider's function for this CQ, with room for `num_entries`.
        Some(f) => unsafe { f(cq, num_entries, wc) },
        None => -libc::EOPNOTSUPP,
    }
}

/// `verbs_get_ctx_op`: the [`verbs_context`] around `ctx` when the library's one reaches
/// the field at `op_offset` (an `offset_of!(verbs_context, <op>)`) and that field is set;
/// `None` for a context of the old ABI, a library too old for the op, or a provider
/// without it. The extended inline verbs (e.g. verbs.h's `ibv_query_port`) go through it.
///
/// # Safety
/// `ctx` is a live context returned by `ibv_open_device`.
pub unsafe fn verbs_context_op(
    ctx: *mut ibv_context,
    op_offset: usize,
) -> Option<*const verbs_context> {
    // SAFETY: the caller's promise: `ctx` is live.
    if unsafe { (*ctx).abi_compat } as usize != VERBS_ABI_IS_EXTENDED {
        return None;
    }
    let vctx = ctx
        .cast::<u8>()
        .wrapping_sub(std::mem::offset_of!(verbs_context, context))
        .cast::<verbs_context>();
    // SAFETY: an extended context is the last field of the library's verbs_context, whose
    // `sz` sits just before it, at the same distance in every version ("grows up").
    let sz = unsafe { (*vctx).sz };
    if sz < std::mem::size_of::<verbs_context>() - op_offset {
        return None;
    }
    // SAFETY: the library's structure reaches `op_offset` (checked just above); the field is
    // a pointer, null when the provider lacks the op.
    let op = unsafe { vctx.cast::<u8>().add(op_offset).cast::<*const ()>().read() };
    (!op.is_null()).then_some(vctx.cast_const())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zeroed verbs_context (all pointers null, all ops absent).
    fn blank() -> Box<verbs_context> {
        // SAFETY: every field is an integer, a raw pointer or an `Option` of a function
        // pointer, for all of which zero is a valid value (0, null, None).
        Box::new(unsafe { std::mem::MaybeUninit::<verbs_context>::zeroed().assume_init() })
    }

    unsafe extern "C" fn fake_poll(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
        assert!(n >= 1);
        // SAFETY: the test passes room for `n` entries and a CQ whose handle it set.
        unsafe {
            *wc = ibv_wc {
                wr_id: 7,
                byte_len: (*cq).handle,
                ..Default::default()
            }
        };
        1
    }

    unsafe extern "C" fn fake_query_port(
        _: *mut ibv_context,
        _: u8,
        _: *mut ibv_port_attr,
        _: usize,
    ) -> c_int {
        0
    }

    #[test]
    fn poll_cq_goes_through_the_context_ops_table() {
        let mut vctx = blank();
        // SAFETY: all-zero is a valid ibv_cq (pointers, integers, pthread objects' zero state).
        let mut cq: ibv_cq = unsafe { std::mem::zeroed() };
        cq.context = &mut vctx.context;
        cq.handle = 4096;
        let mut wc = [ibv_wc::default(); 2];
        // SAFETY: live (fake) CQ and context; room for 2.
        assert_eq!(
            unsafe { poll_cq(&mut cq, 2, wc.as_mut_ptr()) },
            -libc::EOPNOTSUPP,
            "no provider op"
        );
        vctx.context.ops.poll_cq = Some(fake_poll);
        // SAFETY: as above.
        assert_eq!(unsafe { poll_cq(&mut cq, 2, wc.as_mut_ptr()) }, 1);
        assert_eq!((wc[0].wr_id, wc[0].byte_len), (7, 4096));
    }

    #[test]
    fn extended_ops_are_found_only_where_the_library_has_them() {
        let op = std::mem::offset_of!(verbs_context, query_port);
        let mut vctx = blank();
        vctx.query_port = Some(fake_query_port);
        vctx.sz = std::mem::size_of::<verbs_context>();
        let ctx: *mut ibv_context = &mut vctx.context;
        // SAFETY (each call): `ctx` is the (fake) context inside `vctx`, alive throughout.
        assert_eq!(
            unsafe { verbs_context_op(ctx, op) },
            None,
            "old ABI: abi_compat is not the marker"
        );
        vctx.context.abi_compat = VERBS_ABI_IS_EXTENDED as *mut std::ffi::c_void;
        let found = unsafe { verbs_context_op(ctx, op) };
        assert_eq!(found, Some(&*vctx as *const verbs_context));
        vctx.sz -= 8; // a library whose verbs_context does not reach query_port
        assert_eq!(unsafe { verbs_context_op(ctx, op) }, None);
        vctx.sz += 8;
        vctx.query_port = None; // a provider without the op
        assert_eq!(unsafe { verbs_context_op(ctx, op) }, None);
    }
}
