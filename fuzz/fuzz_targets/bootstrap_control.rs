#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rustccl::fuzzing::root_message(data));
