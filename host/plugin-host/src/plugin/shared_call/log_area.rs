//! Plugin log lines (ABI 1.5) crossing from an isolated child with each call's answer:
//! the child writes what it has queued (as much as fits), the router logs it. The router
//! trusts nothing here: the length is clamped and the text parsed as untrusted JSON.

use super::*;
use crate::plugin::LogLine;

/// Room for log lines in a call's region; lines that do not fit wait for the next call.
pub(super) const LOG_BYTES: usize = 16 * 1024;

impl SharedCall {
    /// The child: moves queued lines into the region, as many as fit.
    pub(super) fn write_log_lines(&mut self) {
        let mut room = LOG_BYTES.saturating_sub(2);
        let lines = crate::plugin::logger::drain_queued(|line| {
            // A line's JSON is at most its text escaped (6 bytes a byte) and its frame.
            let need = 6 * (line.origin.len() + line.message.len()) + 64;
            let fits = need <= room;
            room = room.saturating_sub(need);
            fits
        });
        let fields = self.fields();
        fields.log_len = 0;
        if lines.is_empty() {
            return;
        }
        if let Ok(json) = serde_json::to_vec(&lines) {
            if json.len() <= LOG_BYTES {
                fields.log[..json.len()].copy_from_slice(&json);
                fields.log_len = json.len() as u32;
            }
        }
    }

    /// The router: logs the lines the child sent with this answer.
    pub fn read_log_lines(&mut self) {
        let fields = self.fields();
        let len = (fields.log_len as usize).min(LOG_BYTES);
        fields.log_len = 0;
        if len == 0 {
            return;
        }
        if let Ok(lines) = serde_json::from_slice::<Vec<LogLine>>(&fields.log[..len]) {
            lines.into_iter().for_each(LogLine::emit);
        }
    }
}
