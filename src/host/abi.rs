//! The Proxy-Wasm host calls kvroute's filter and call answers read and write through, declared
//! here instead of taken from proxy-wasm 0.2's `hostcalls`: those panic on any status they do not
//! expect (and on a header value that is not UTF-8), and Envoy returns such statuses in ordinary
//! cases — reading an HTTP call's answer headers after Envoy ended the call with a reset, an
//! overflow or a timeout gives `BadArgument`, since there is no answer. A panic aborts the VM and
//! Envoy re-creates it, losing its index and learned costs. Every call here returns
//! `None` or `false` on any status but `Ok`; statuses stay `u32` (a Rust enum given a value it
//! does not list would be undefined behaviour).
//!
//! Memory the host returns was allocated through the SDK's `proxy_on_memory_allocate` (a boxed
//! byte slice of exactly that size), so it is taken back as a `Vec` of that length and capacity,
//! as the SDK itself does.

use proxy_wasm::types::{BufferType, MapType};
use std::ptr::{null, null_mut};

const OK: u32 = 0;
/// `proxy_continue_stream`'s request direction.
const HTTP_REQUEST: u32 = 0;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_header_map_pairs(map: u32, data: *mut *mut u8, size: *mut usize) -> u32;
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map: u32, key: *const u8, key_size: usize) -> u32;
    fn proxy_get_buffer_bytes(
        buffer: u32,
        start: usize,
        max_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        buffer: u32,
        start: usize,
        size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_set_property(
        path: *const u8,
        path_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_continue_stream(stream: u32) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
}

/// The bytes the host wrote for a getter that answered `status`.
fn returned(status: u32, data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if status != OK {
        return None;
    }
    if data.is_null() {
        return Some(Vec::new());
    }
    // SAFETY: the host allocated `size` bytes at `data` with this module's allocator, for us.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

/// A whole header map, serialised (`crate::headermap::decode` reads it).
pub fn header_map(map: MapType) -> Option<Vec<u8>> {
    let (mut data, mut size) = (null_mut(), 0);
    // SAFETY: out-pointers to locals; the host writes a pointer and a size or nothing.
    let status = unsafe { proxy_get_header_map_pairs(map as u32, &mut data, &mut size) };
    returned(status, data, size)
}

/// One header's value as bytes; `None` when absent or when the map is not there at all (an HTTP
/// call Envoy ended without an answer).
pub fn header(map: MapType, name: &str) -> Option<Vec<u8>> {
    let (mut data, mut size) = (null_mut(), 0);
    // SAFETY: `name` outlives the call; out-pointers to locals.
    let status = unsafe {
        proxy_get_header_map_value(map as u32, name.as_ptr(), name.len(), &mut data, &mut size)
    };
    returned(status, data, size)
}

pub fn set_header(map: MapType, name: &str, value: &str) -> bool {
    // SAFETY: both slices outlive the call; the host copies them.
    let status = unsafe {
        proxy_replace_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    };
    status == OK
}

pub fn remove_header(map: MapType, name: &str) -> bool {
    // SAFETY: `name` outlives the call.
    unsafe { proxy_remove_header_map_value(map as u32, name.as_ptr(), name.len()) == OK }
}

/// Up to `max` bytes of a buffer from `start`; `None` when there is none.
pub fn buffer(kind: BufferType, start: usize, max: usize) -> Option<Vec<u8>> {
    let (mut data, mut size) = (null_mut(), 0);
    // SAFETY: out-pointers to locals.
    let status = unsafe { proxy_get_buffer_bytes(kind as u32, start, max, &mut data, &mut size) };
    returned(status, data, size)
}

/// Replaces `size` bytes of a buffer from `start` with `value`.
pub fn set_buffer(kind: BufferType, start: usize, size: usize, value: &[u8]) -> bool {
    // SAFETY: `value` outlives the call; the host copies it.
    unsafe { proxy_set_buffer_bytes(kind as u32, start, size, value.as_ptr(), value.len()) == OK }
}

/// A stream attribute (`upstream.address`), as bytes.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    let serialised = path.join("\0");
    let (mut data, mut size) = (null_mut(), 0);
    // SAFETY: `serialised` outlives the call; out-pointers to locals.
    let status =
        unsafe { proxy_get_property(serialised.as_ptr(), serialised.len(), &mut data, &mut size) };
    returned(status, data, size)
}

/// Sets a stream attribute (Envoy keeps it as filter state `wasm.<name>`).
pub fn set_property(path: &[&str], value: &[u8]) -> bool {
    let serialised = path.join("\0");
    // SAFETY: both slices outlive the call; the host copies them.
    let status = unsafe {
        proxy_set_property(
            serialised.as_ptr(),
            serialised.len(),
            value.as_ptr(),
            value.len(),
        )
    };
    status == OK
}

/// Answers the request locally.
pub fn send_response(status: u32, headers: &[(&str, &str)], body: &[u8]) -> bool {
    let headers = crate::headermap::encode(headers);
    // SAFETY: every slice outlives the call; the host copies them. -1: not a gRPC status.
    let status = unsafe {
        proxy_send_local_response(
            status,
            null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    };
    status == OK
}

/// Makes the calls that follow act on the context `context_id` (an HTTP stream of this VM, or back
/// to the caller's own): how flow control's tick releases a held request (`super::held`).
/// `false` when the host no longer knows the context (its stream ended).
pub fn set_effective_context(context_id: u32) -> bool {
    // SAFETY: no pointers.
    unsafe { proxy_set_effective_context(context_id) == OK }
}

/// Lets a paused request go on.
pub fn resume_request() -> bool {
    // SAFETY: no pointers.
    unsafe { proxy_continue_stream(HTTP_REQUEST) == OK }
}
