#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rustccl_netif::fuzzing::socket_ifname(&String::from_utf8_lossy(data)));
