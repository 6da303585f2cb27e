//! Exists for loader tests: a shared library with an ordinary C function and no rustccl
//! plugin symbol (`rustccl_<kind>_v<N>`), which the loader must report as "not a plugin".

/// Returns 42; a symbol for the test to find, proving the library itself loads.
#[no_mangle]
pub extern "C" fn rustccl_test_not_a_plugin_answer() -> i32 {
    42
}
