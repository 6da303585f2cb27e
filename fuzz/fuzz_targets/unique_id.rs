#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rustccl::fuzzing::unique_id(data));
