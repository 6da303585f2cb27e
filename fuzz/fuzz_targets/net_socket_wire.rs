#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rustccl_net_socket::wire::fuzzing::wire(data));
