//! A rank's output read line by line with a cap: a rank that prints a gigabyte without a newline (a hostile
//! model's `print`) costs the agent at most [`MAX_LINE`] bytes, not its memory, and with it every other
//! tenant's ranks on the node. The rest of an overlong line is dropped.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The most of one line the agent keeps (metric lines are a few hundred bytes; logs are cut at 4 KiB later).
pub const MAX_LINE: usize = 64 << 10;

#[derive(Debug)]
pub struct CappedLines<R> {
    reader: R,
}

impl<R: AsyncBufRead + Unpin> CappedLines<R> {
    pub fn new(reader: R) -> Self {
        CappedLines { reader }
    }

    /// The next line (without its newline, cut at [`MAX_LINE`] bytes), or `None` at the end.
    pub async fn next_line(&mut self) -> std::io::Result<Option<String>> {
        let mut line: Vec<u8> = Vec::new();
        let mut read_any = false;
        loop {
            let buffer = self.reader.fill_buf().await?;
            if buffer.is_empty() {
                return Ok(read_any.then(|| String::from_utf8_lossy(&line).into_owned()));
            }
            read_any = true;
            let (chunk, ends) = match buffer.iter().position(|&b| b == b'\n') {
                Some(at) => (&buffer[..at], Some(at + 1)),
                None => (buffer, None),
            };
            let room = MAX_LINE.saturating_sub(line.len());
            line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            let consumed = ends.unwrap_or(buffer.len());
            self.reader.consume(consumed);
            if ends.is_some() {
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_split_and_an_endless_one_is_cut_without_being_held() {
        let mut input = b"first\nsecond\r\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 10 * MAX_LINE));
        input.extend(b"\nlast");
        let mut lines = CappedLines::new(tokio::io::BufReader::new(input.as_slice()));
        assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("first"));
        assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("second"));
        assert_eq!(lines.next_line().await.unwrap().map(|l| l.len()), Some(MAX_LINE));
        assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("last"));
        assert_eq!(lines.next_line().await.unwrap(), None);
    }

    /// A rank printing 100 MB without a newline: the agent reads past it, keeping 64 KiB of it.
    #[tokio::test]
    async fn a_hundred_megabyte_line_from_a_process_is_cut_and_the_next_line_still_read() {
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", "head -c 100000000 /dev/zero | tr '\\0' 'a'; echo; echo after"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = CappedLines::new(tokio::io::BufReader::new(child.stdout.take().unwrap()));
        assert_eq!(lines.next_line().await.unwrap().map(|l| l.len()), Some(MAX_LINE));
        assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("after"));
        assert!(child.wait().await.unwrap().success());
    }
}
