#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rustccl::fuzzing::bootstrap_frames(data));
