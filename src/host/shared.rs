//! Thin, non-panicking wrappers over shared data and shared queues.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

pub fn get(key: &str) -> (Option<Vec<u8>>, Option<u32>) {
    hostcalls::get_shared_data(key).unwrap_or((None, None))
}

pub fn set(key: &str, value: &[u8]) -> bool {
    hostcalls::set_shared_data(key, Some(value), None).is_ok()
}

/// Compare-and-swap; `Err(CasMismatch)` when someone wrote in between.
pub fn cas(key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status> {
    hostcalls::set_shared_data(key, Some(value), cas)
}

pub fn get_u64(key: &str) -> Option<u64> {
    let bytes = get(key).0?;
    Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?))
}

pub fn set_u64(key: &str, value: u64) -> bool {
    set(key, &value.to_le_bytes())
}

pub fn enqueue(queue: u32, message: &[u8]) -> bool {
    hostcalls::enqueue_shared_queue(queue, Some(message)).is_ok()
}

pub fn dequeue(queue: u32) -> Option<Vec<u8>> {
    hostcalls::dequeue_shared_queue(queue).ok().flatten()
}
