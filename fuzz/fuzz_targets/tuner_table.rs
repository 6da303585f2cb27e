#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rustccl_tuner_default::fuzzing::rule_table(&String::from_utf8_lossy(data)));
