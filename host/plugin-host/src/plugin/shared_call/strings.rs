//! Strings in the region, length-prefixed (`[u32 len][bytes]`): the request's attributes
//! (whole or not at all) and the adapter lists of engine reports, written by the parent
//! and read back by the child.

use super::RequestAttributes;

/// Length-prefixed pieces: `[u32 len][bytes]`, `u32::MAX` for an absent one.
pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn u32(&mut self) -> Option<u32> {
        let (head, rest) = self.bytes.split_first_chunk::<4>()?;
        self.bytes = rest;
        Some(u32::from_le_bytes(*head))
    }

    /// A piece; `Some(None)` when it is marked absent.
    pub(super) fn optional(&mut self) -> Option<Option<String>> {
        let len = self.u32()?;
        if len == u32::MAX {
            return Some(None);
        }
        let len = len as usize;
        if len > self.bytes.len() {
            return None;
        }
        let (text, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Some(Some(String::from_utf8_lossy(text).into_owned()))
    }

    pub(super) fn text(&mut self) -> Option<String> {
        self.optional().flatten()
    }
}

struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn u32(&mut self, value: u32) -> Option<()> {
        self.out
            .get_mut(self.at..self.at + 4)?
            .copy_from_slice(&value.to_le_bytes());
        self.at += 4;
        Some(())
    }

    fn optional(&mut self, text: Option<&str>) -> Option<()> {
        let Some(text) = text else {
            return self.u32(u32::MAX);
        };
        self.u32(u32::try_from(text.len()).ok().filter(|&l| l != u32::MAX)?)?;
        self.out
            .get_mut(self.at..self.at + text.len())?
            .copy_from_slice(text.as_bytes());
        self.at += text.len();
        Some(())
    }
}

/// Writes `attributes` into `out`; the bytes used, or `None` when they do not fit.
pub(super) fn encode_attributes(attributes: &RequestAttributes, out: &mut [u8]) -> Option<usize> {
    let mut w = Writer { out, at: 0 };
    w.optional(Some(&attributes.request_id))?;
    w.optional(Some(&attributes.model))?;
    w.optional(attributes.lora_adapter.as_deref())?;
    w.optional(attributes.tenant.as_deref())?;
    w.u32(u32::try_from(attributes.headers.len()).ok()?)?;
    for (name, value) in &attributes.headers {
        w.optional(Some(name))?;
        w.optional(Some(value))?;
    }
    Some(w.at)
}

pub(super) fn decode_attributes(bytes: &[u8]) -> Option<RequestAttributes> {
    let mut r = Reader { bytes };
    let request_id = r.text()?;
    let model = r.text()?;
    let lora_adapter = r.optional()?;
    let tenant = r.optional()?;
    let count = r.u32()?;
    let headers = (0..count)
        .map_while(|_| Some((r.text()?, r.text()?)))
        .collect();
    Some(RequestAttributes {
        request_id,
        model,
        lora_adapter,
        tenant,
        headers,
    })
}
