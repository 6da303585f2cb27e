//! NCCL 2.30's parameter API over rustccl's parameter table (`rustccl::params::table`).
//! Values are read through `rustccl::params::resolve`, the lookup every parameter read of the
//! library goes through (the env plugin when one is in use, else the environment, then NCCL's
//! configuration files); `ncclParamDumpAll` logs each with where it came from, by NCCL's names
//! (`set_by=EnvVar`, `EnvPlugin`, `ConfigFile`, `Default`).
//!
//! An `ncclParamHandle_t` is the address of a table entry; handles are checked against the
//! table before use, so a stale or made-up handle is an `ncclInvalidArgument`, never a read.
//! Integer and flag parameters read through any integer getter whose type holds the value;
//! string parameters only through `ncclParamGetStr` (as NCCL, which refuses type mismatches).
//! `ncclParamGet` copies the native value: an `int64_t` for integers, one byte (0/1) for
//! flags, the NUL-terminated text for strings. Returned strings and tables live until the
//! next call of the same function on the same thread.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_void};

use rustccl::params::table::{self, Param, ParamType, ParamValue, PARAMS};
use rustccl::Error;

use crate::comm_api::out_ptr;
use crate::{guard, nccl_api, NcclResult};

/// `ncclParamHandle_t`: an entry of the table.
type ParamHandle = *const Param;

thread_local! {
    static STR_VALUE: RefCell<CString> = RefCell::new(CString::default());
    static PARAMETER_VALUE: RefCell<CString> = RefCell::new(CString::default());
    static KEYS: RefCell<(Vec<CString>, Vec<*const c_char>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

fn key_arg(key: *const c_char, what: &str) -> Result<&'static Param, Error> {
    if key.is_null() {
        return Err(Error::invalid_argument(format!("{what}: key is NULL")));
    }
    // SAFETY: a non-null C string from the caller.
    let key = unsafe { CStr::from_ptr(key) }.to_string_lossy();
    table::find(&key)
}

/// The table entry behind a handle; anything else is refused without being read.
fn entry(h: ParamHandle) -> Result<&'static Param, Error> {
    if h.is_null() {
        return Err(Error::invalid_argument("the parameter handle is NULL (ncclParamBind makes one)"));
    }
    PARAMS.iter().find(|p| std::ptr::eq(*p, h)).ok_or_else(|| {
        Error::invalid_argument(format!("{h:p} is not a parameter handle made by ncclParamBind"))
    })
}

/// Reads an integer or flag parameter into `out` as `T`.
fn get_int<T: TryFrom<i64> + Copy>(h: ParamHandle, out: *mut T, what: &str, type_name: &str) -> Result<(), Error> {
    let p = entry(h)?;
    out_ptr(out, what, "out")?;
    let value = p.value()?;
    let Some(v) = value.as_int() else {
        return Err(Error::invalid_argument(format!(
            "{} is a string parameter, not an integer: read it with ncclParamGetStr",
            p.name
        )));
    };
    let v = T::try_from(v)
        .map_err(|_| Error::invalid_argument(format!("{} = {v} does not fit in {type_name}: read it with a wider getter", p.name)))?;
    // SAFETY: checked non-null; the caller's `T`.
    unsafe { *out = v };
    Ok(())
}

/// Keeps `text` in a thread's buffer and returns its address.
fn keep(cell: &'static std::thread::LocalKey<RefCell<CString>>, text: &str) -> *const c_char {
    cell.with(|s| {
        *s.borrow_mut() = CString::new(text.replace('\0', " ")).unwrap_or_default();
        s.borrow().as_ptr()
    })
}

macro_rules! int_getters {
    ($( $name:ident / $pname:ident : $t:ty ),* $(,)?) => {
        nccl_api! {$(
            fn $name / $pname(h: ParamHandle, out: *mut $t) -> NcclResult {
                guard(stringify!($name), || get_int::<$t>(h, out, stringify!($name), stringify!($t)))
            }
        )*}
    };
}

int_getters! {
    ncclParamGetI8 / pncclParamGetI8: i8,
    ncclParamGetI16 / pncclParamGetI16: i16,
    ncclParamGetI32 / pncclParamGetI32: i32,
    ncclParamGetI64 / pncclParamGetI64: i64,
    ncclParamGetU8 / pncclParamGetU8: u8,
    ncclParamGetU16 / pncclParamGetU16: u16,
    ncclParamGetU32 / pncclParamGetU32: u32,
    ncclParamGetU64 / pncclParamGetU64: u64,
}

nccl_api! {
    fn ncclParamBind / pncclParamBind(out: *mut ParamHandle, key: *const c_char) -> NcclResult {
        guard("ncclParamBind", || {
            out_ptr(out, "ncclParamBind", "out")?;
            let p = key_arg(key, "ncclParamBind")?;
            // SAFETY: checked non-null.
            unsafe { *out = p as *const Param };
            Ok(())
        })
    }

    fn ncclParamGetStr / pncclParamGetStr(h: ParamHandle, out: *mut *const c_char) -> NcclResult {
        guard("ncclParamGetStr", || {
            let p = entry(h)?;
            out_ptr(out, "ncclParamGetStr", "out")?;
            if p.ty != ParamType::Str {
                return Err(Error::invalid_argument(format!(
                    "{} is an integer parameter, not a string: read it with an integer getter (ncclParamGetI64), or as text with ncclParamGetParameter",
                    p.name
                )));
            }
            let text = p.value()?.to_text();
            // SAFETY: checked non-null.
            unsafe { *out = keep(&STR_VALUE, &text) };
            Ok(())
        })
    }

    fn ncclParamGet / pncclParamGet(h: ParamHandle, out: *mut c_void, max_len: c_int, len: *mut c_int) -> NcclResult {
        guard("ncclParamGet", || {
            let p = entry(h)?;
            out_ptr(out, "ncclParamGet", "out")?;
            out_ptr(len, "ncclParamGet", "len")?;
            let bytes = match p.value()? {
                ParamValue::Int(v) => v.to_ne_bytes().to_vec(),
                ParamValue::Bool(b) => vec![b as u8],
                v @ (ParamValue::Str(_) | ParamValue::Unset) => {
                    let mut t = v.to_text().into_bytes();
                    t.push(0);
                    t
                }
            };
            let need = c_int::try_from(bytes.len()).unwrap_or(c_int::MAX);
            // SAFETY: checked non-null.
            unsafe { *len = need };
            if max_len < need {
                return Err(Error::invalid_argument(format!(
                    "{}: the value needs {need} bytes, maxLen is {max_len} (*len says how many)",
                    p.name
                )));
            }
            // SAFETY: the caller's buffer has `max_len` >= `need` bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as *mut u8, bytes.len()) };
            Ok(())
        })
    }

    fn ncclParamGetParameter / pncclParamGetParameter(key: *const c_char, value: *mut *const c_char, value_len: *mut c_int) -> NcclResult {
        guard("ncclParamGetParameter", || {
            out_ptr(value, "ncclParamGetParameter", "value")?;
            out_ptr(value_len, "ncclParamGetParameter", "valueLen")?;
            let p = key_arg(key, "ncclParamGetParameter")?;
            let text = p.value()?.to_text();
            // SAFETY: both checked non-null.
            unsafe {
                *value = keep(&PARAMETER_VALUE, &text);
                *value_len = c_int::try_from(CStr::from_ptr(*value).to_bytes().len()).unwrap_or(c_int::MAX);
            }
            Ok(())
        })
    }

    fn ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys(out: *mut *const *const c_char, len: *mut c_int) -> NcclResult {
        guard("ncclParamGetAllParameterKeys", || {
            out_ptr(out, "ncclParamGetAllParameterKeys", "table")?;
            out_ptr(len, "ncclParamGetAllParameterKeys", "tableLen")?;
            KEYS.with(|k| {
                let mut k = k.borrow_mut();
                k.0 = table::listed().map(|p| CString::new(p.name).unwrap_or_default()).collect();
                k.1 = k.0.iter().map(|s| s.as_ptr()).collect();
                // SAFETY: both checked non-null; the table lives in this thread's buffer.
                unsafe {
                    *out = k.1.as_ptr();
                    *len = k.1.len() as c_int;
                }
            });
            Ok(())
        })
    }

    fn ncclParamDumpAll / pncclParamDumpAll() -> () {
        rustccl::log::init();
        table::dump_all();
    }
}
