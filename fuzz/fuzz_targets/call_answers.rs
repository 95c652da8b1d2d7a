#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvroute_fuzz::call_answers(data));
