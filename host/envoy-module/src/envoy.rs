//! Envoy's side of one stream, through the ABI's callbacks: each call is valid only
//! inside a hook of that stream, on its worker thread (the hooks hand this out for
//! the hook's duration).

use std::borrow::Cow;
use std::net::SocketAddr;

use crate::abi::{self, Buffer, FilterEnvoyPtr, ModuleHeader};

/// Envoy's filter of the stream a hook runs for.
#[derive(Clone, Copy)]
pub struct Stream(pub FilterEnvoyPtr);

impl Stream {
    /// The first value of header `name` (lowercase) of `header_type`.
    pub fn header(&self, header_type: u32, name: &str) -> Option<&[u8]> {
        let mut value = Buffer::NULL;
        // SAFETY: a hook's filter pointer; the key outlives the call; `value` is written.
        let found = unsafe {
            abi::envoy_dynamic_module_callback_http_get_header(
                self.0,
                header_type,
                Buffer::of(name.as_bytes()),
                &mut value,
                0,
                std::ptr::null_mut(),
            )
        };
        // SAFETY: Envoy's header bytes stay valid until the hook returns, and `self`
        // lives no longer than the hook.
        (found && !value.ptr.is_null()).then(|| unsafe { value.bytes() })
    }

    /// The strings of the stream's dynamic metadata `namespace` / `key`: a list's
    /// elements, or one string's comma-separated parts (as the picker reads the
    /// Inference Extension's hints).
    pub fn metadata_strings(&self, namespace: &str, key: &str) -> Option<Vec<String>> {
        let (ns, key) = (Buffer::of(namespace.as_bytes()), Buffer::of(key.as_bytes()));
        let text = |value: Buffer| {
            // SAFETY: Envoy's metadata bytes, valid during the hook; copied here.
            String::from_utf8_lossy(unsafe { value.bytes() }).into_owned()
        };
        let mut size = 0usize;
        // SAFETY: a hook's filter pointer; the buffers outlive the calls; results written.
        unsafe {
            if abi::envoy_dynamic_module_callback_http_get_metadata_list_size(
                self.0,
                abi::METADATA_DYNAMIC,
                ns,
                key,
                &mut size,
            ) {
                let mut strings = Vec::with_capacity(size);
                for index in 0..size {
                    let mut value = Buffer::NULL;
                    if abi::envoy_dynamic_module_callback_http_get_metadata_list_string(
                        self.0,
                        abi::METADATA_DYNAMIC,
                        ns,
                        key,
                        index,
                        &mut value,
                    ) {
                        strings.push(text(value));
                    }
                }
                return Some(strings);
            }
            let mut value = Buffer::NULL;
            if !abi::envoy_dynamic_module_callback_http_get_metadata_string(
                self.0,
                abi::METADATA_DYNAMIC,
                ns,
                key,
                &mut value,
            ) {
                return None;
            }
            let joined = text(value);
            let parts = joined.split(',').map(str::trim).filter(|s| !s.is_empty());
            Some(parts.map(str::to_owned).collect())
        }
    }

    /// The upstream host Envoy's router tried last: at the response headers, the one
    /// that answered, whatever the route's retries did before. None when no host was
    /// tried or its address is not `ip:port`.
    pub fn last_upstream_host_attempted(&self) -> Option<SocketAddr> {
        // SAFETY: a hook's filter pointer; `filled` has room for every host Envoy
        // reports; the bytes are read before the hook returns.
        unsafe {
            let count =
                abi::envoy_dynamic_module_callback_http_get_upstream_hosts_attempted_size(self.0);
            filled(
                count,
                |hosts| {
                    abi::envoy_dynamic_module_callback_http_get_upstream_hosts_attempted(
                        self.0, hosts,
                    )
                },
                |hosts| {
                    let last = hosts.iter().rev().find(|h| !h.ptr.is_null())?;
                    std::str::from_utf8(last.bytes()).ok()?.parse().ok()
                },
            )
            .flatten()
        }
    }

    pub fn set_request_header(&self, name: &str, value: &str) {
        // SAFETY: a hook's filter pointer; both buffers outlive the call (Envoy copies).
        unsafe {
            abi::envoy_dynamic_module_callback_http_set_header(
                self.0,
                abi::REQUEST_HEADER,
                Buffer::of(name.as_bytes()),
                Buffer::of(value.as_bytes()),
            );
        }
    }

    /// Sends the request to `host` (`ip:port`) among the routed cluster's hosts (strict: a host
    /// the cluster lacks is Envoy's 503, never another engine). False if Envoy refused.
    pub fn override_host(&self, host: &str) -> bool {
        // SAFETY: a hook's filter pointer; Envoy copies the host.
        unsafe {
            abi::envoy_dynamic_module_callback_http_set_upstream_override_host(
                self.0,
                Buffer::of(host.as_bytes()),
                true,
            )
        }
    }

    /// The request body: what Envoy buffered, then the chunk this hook received (unless
    /// the received chunk is the buffer, when a filter before this one buffered it all).
    /// Envoy's own bytes when they are one chunk, as a body sent at once is (nothing
    /// copied on the worker thread, however long the prompt), else the chunks joined.
    pub fn request_body(&self) -> Cow<'_, [u8]> {
        // SAFETY: a hook's filter pointer.
        let received_is_buffered = unsafe {
            abi::envoy_dynamic_module_callback_http_received_buffered_request_body(self.0)
        };
        let buffered = self.body(abi::BUFFERED_REQUEST_BODY);
        if received_is_buffered {
            return buffered;
        }
        let received = self.body(abi::RECEIVED_REQUEST_BODY);
        match (buffered.is_empty(), received.is_empty()) {
            (_, true) => buffered,
            (true, false) => received,
            (false, false) => Cow::Owned([buffered, received].concat()),
        }
    }

    /// The request body Envoy buffered (at the request trailers: all of it).
    pub fn buffered_request_body(&self) -> Cow<'_, [u8]> {
        self.body(abi::BUFFERED_REQUEST_BODY)
    }

    /// Bytes of the request body so far (buffered and just received).
    pub fn request_body_size(&self) -> usize {
        // SAFETY: a hook's filter pointer.
        let size =
            |kind| unsafe { abi::envoy_dynamic_module_callback_http_get_body_size(self.0, kind) };
        size(abi::BUFFERED_REQUEST_BODY) + size(abi::RECEIVED_REQUEST_BODY)
    }

    /// Envoy's `body_type` body: its one chunk borrowed, or its chunks joined.
    fn body(&self, body_type: u32) -> Cow<'_, [u8]> {
        // SAFETY: a hook's filter pointer; `filled` has room for every chunk Envoy
        // reports; the chunks' bytes stay valid until the hook returns (no body setter
        // runs while they are read), and `self` lives no longer than the hook.
        unsafe {
            let count =
                abi::envoy_dynamic_module_callback_http_get_body_chunks_size(self.0, body_type);
            filled(
                count,
                |chunks| {
                    abi::envoy_dynamic_module_callback_http_get_body_chunks(
                        self.0, body_type, chunks,
                    )
                },
                |chunks| match chunks {
                    [one] => Cow::Borrowed(one.bytes()),
                    chunks => {
                        let mut body = Vec::with_capacity(chunks.iter().map(|c| c.length).sum());
                        for chunk in chunks {
                            body.extend_from_slice(chunk.bytes());
                        }
                        Cow::Owned(body)
                    }
                },
            )
            .unwrap_or_default()
        }
    }

    /// Answers the request itself (Envoy's local reply): `status`, a JSON body, and
    /// `retry-after` when given.
    pub fn reply(&self, status: u16, body: &[u8], retry_after: Option<u64>) {
        let retry = retry_after.map(|s| s.to_string());
        let mut headers = vec![ModuleHeader::of(b"content-type", b"application/json")];
        if let Some(retry) = &retry {
            headers.push(ModuleHeader::of(b"retry-after", retry.as_bytes()));
        }
        // SAFETY: a hook's filter pointer; headers, body and details outlive the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_send_response(
                self.0,
                u32::from(status),
                headers.as_mut_ptr(),
                headers.len(),
                Buffer::of(body),
                Buffer::of(b"switchyard_refused"),
            );
        }
    }

    /// Lets Envoy buffer at least `bytes` of this stream's body (its own limit, the
    /// listener's `per_connection_buffer_limit_bytes`, 1 MiB by default, answers 413
    /// past it).
    pub fn buffer_at_least(&self, bytes: usize) {
        let bytes = bytes as u64;
        // SAFETY: a hook's filter pointer.
        unsafe {
            let limit = abi::envoy_dynamic_module_callback_http_get_buffer_limit(self.0);
            if limit != 0 && limit < bytes {
                abi::envoy_dynamic_module_callback_http_set_buffer_limit(self.0, bytes);
            }
        }
    }

    /// Lets the request go on after the module held it (`StopIteration`).
    pub fn continue_decoding(&self) {
        // SAFETY: a hook's filter pointer.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_continue_decoding(self.0) }
    }
}

/// Envoy's scheduler of one stream: work finished on another thread resumes the stream on
/// its worker thread. Deleted when the last holder (the stream, or the work) drops it;
/// committing after the stream is gone is harmless (Envoy checks that it still exists).
pub struct Scheduler(abi::SchedulerPtr);

// SAFETY: Envoy's scheduler may be committed from any thread (abi.h); it is deleted once,
// by the last owner.
unsafe impl Send for Scheduler {}
unsafe impl Sync for Scheduler {}

impl Scheduler {
    /// A scheduler of the stream (call inside one of its hooks).
    pub fn new(stream: Stream) -> Option<Scheduler> {
        // SAFETY: a hook's filter pointer.
        let made =
            unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_new(stream.0) };
        (!made.is_null()).then_some(Scheduler(made))
    }

    pub fn commit(&self, event_id: u64) {
        // SAFETY: a live scheduler (deleted only in drop).
        unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_commit(self.0, event_id) }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        // SAFETY: made by scheduler_new, deleted once.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_delete(self.0) }
    }
}

/// `read` over the `count` buffers Envoy writes through `fill` (false: it wrote none, and
/// this is None, as it is for a count of 0). A few, the usual case, are listed on the
/// stack.
fn filled<R>(
    count: usize,
    fill: impl FnOnce(*mut Buffer) -> bool,
    read: impl FnOnce(&[Buffer]) -> R,
) -> Option<R> {
    const ON_STACK: usize = 4;
    let mut few = [Buffer::NULL; ON_STACK];
    let mut many = Vec::new();
    let buffers: &mut [Buffer] = match count {
        0 => return None,
        1..=ON_STACK => &mut few[..count],
        _ => {
            many.resize(count, Buffer::NULL);
            &mut many
        }
    };
    fill(buffers.as_mut_ptr()).then(|| read(buffers))
}
