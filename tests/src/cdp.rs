//! Just enough of the Chrome DevTools Protocol to use a page as a person does: start headless
//! Chromium on a URL, evaluate script in the page (read what it shows), and take a
//! screenshot. The WebSocket under it is written here (client frames masked, server frames
//! reassembled), so a test needs no browser-automation dependency.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use base64::Engine;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The first of `chromium`, `chromium-browser`, `google-chrome` on `PATH`.
pub fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|b| sluice_bench::sys::which(b))
}

/// A headless Chromium showing one page, driven over DevTools.
pub struct Browser {
    child: Child,
    ws: TcpStream,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser").finish_non_exhaustive()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET on Chromium's DevTools HTTP endpoint, the body (read by its `Content-Length`: the
/// endpoint does not close the connection).
async fn devtools_get(port: u16, path: &str) -> anyhow::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes())
        .await?;
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut all = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                bail!("DevTools closed before the body");
            }
            all.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&all);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .context("no Content-Length")?;
                if body.len() >= len {
                    return Ok(body[..len].to_string());
                }
            }
        }
    })
    .await
    .context("DevTools HTTP did not answer in 10 s")?
}

impl Browser {
    /// Starts Chromium on `url` with a `width`×`height` window and connects to the page.
    pub async fn open(url: &str, width: u32, height: u32) -> anyhow::Result<Browser> {
        let exe = chromium().ok_or_else(|| anyhow!("no Chromium on PATH"))?;
        let profile = tempfile::tempdir()?;
        let mut child = Command::new(exe)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--window-size={width},{height}"))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().context("no stderr")?;
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
        let port = tokio::time::timeout(Duration::from_secs(30), async {
            let mut lines = BufReader::new(tokio::process::ChildStderr::from_std(stderr)?).lines();
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.split("ws://127.0.0.1:").nth(1) {
                    let port: u16 = rest.split('/').next().unwrap_or("").parse()?;
                    // Keep reading (and dropping) the rest so Chromium never blocks on it.
                    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                    return Ok::<u16, anyhow::Error>(port);
                }
            }
            bail!("Chromium exited before DevTools listened")
        })
        .await
        .context("DevTools did not start in 30 s")??;
        // The page target (retried: it appears just after the browser's).
        let mut page_ws = None;
        for _ in 0..50 {
            let list: serde_json::Value =
                serde_json::from_str(&devtools_get(port, "/json/list").await?)?;
            page_ws = list.as_array().and_then(|l| {
                l.iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_string))
            });
            if page_ws.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let page_ws = page_ws.context("no page target")?;
        let path = page_ws
            .split_once(&format!("127.0.0.1:{port}"))
            .map(|(_, p)| p.to_string())
            .context("odd DevTools URL")?;
        let mut ws = TcpStream::connect(("127.0.0.1", port)).await?;
        ws.write_all(
            format!(
                "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Key: c2x1aWNlLWNkcC1rZXkxMg==\r\n\
                 Sec-WebSocket-Version: 13\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            ws.read_exact(&mut b).await?;
            head.push(b[0]);
        }
        if !head.starts_with(b"HTTP/1.1 101") {
            bail!("WebSocket refused: {}", String::from_utf8_lossy(&head));
        }
        Ok(Browser {
            child,
            ws,
            next_id: 0,
            _profile: profile,
        })
    }

    async fn send_frame(&mut self, payload: &[u8]) -> anyhow::Result<()> {
        let mut f = vec![0x81u8];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n <= usize::from(u16::MAX) => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask: [u8; 4] = fastrand::u32(..).to_be_bytes();
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.ws.write_all(&f).await?;
        Ok(())
    }

    /// One whole message (fragments joined); pings answered, close is an error.
    async fn read_message(&mut self) -> anyhow::Result<Vec<u8>> {
        let mut msg = Vec::new();
        loop {
            let mut h = [0u8; 2];
            self.ws.read_exact(&mut h).await?;
            let (fin, opcode) = (h[0] & 0x80 != 0, h[0] & 0x0f);
            let len = match h[1] & 0x7f {
                126 => {
                    let mut b = [0u8; 2];
                    self.ws.read_exact(&mut b).await?;
                    u64::from(u16::from_be_bytes(b))
                }
                127 => {
                    let mut b = [0u8; 8];
                    self.ws.read_exact(&mut b).await?;
                    u64::from_be_bytes(b)
                }
                n => u64::from(n),
            };
            let mut payload = vec![0u8; usize::try_from(len)?];
            self.ws.read_exact(&mut payload).await?;
            match opcode {
                0x8 => bail!("DevTools closed the connection"),
                0x9 => {
                    // Pong with the same payload.
                    let mut f = vec![0x8a, 0x80 | payload.len() as u8, 0, 0, 0, 0];
                    f.extend_from_slice(&payload);
                    self.ws.write_all(&f).await?;
                }
                0xa => {}
                _ => {
                    msg.extend_from_slice(&payload);
                    if fin {
                        return Ok(msg);
                    }
                }
            }
        }
    }

    /// Sends one DevTools command and returns its `result` (events on the way are skipped).
    pub async fn call(
        &mut self,
        method: &str,
        params: serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        self.next_id += 1;
        let id = self.next_id;
        let msg = serde_json::json!({"id": id, "method": method, "params": params});
        self.send_frame(msg.to_string().as_bytes()).await?;
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let m: serde_json::Value = serde_json::from_slice(&self.read_message().await?)?;
                if m["id"] == id {
                    if let Some(e) = m.get("error") {
                        bail!("{method}: {e}");
                    }
                    return Ok(m["result"].clone());
                }
            }
        })
        .await
        .with_context(|| format!("{method}: no answer in 30 s"))?
    }

    /// Evaluates `expr` in the page (awaiting a promise) and returns its value.
    pub async fn eval(&mut self, expr: &str) -> anyhow::Result<serde_json::Value> {
        let r = self
            .call(
                "Runtime.evaluate",
                serde_json::json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
            )
            .await?;
        if let Some(e) = r.get("exceptionDetails") {
            bail!("script threw: {e}");
        }
        Ok(r["result"]["value"].clone())
    }

    /// A PNG of the whole page.
    pub async fn screenshot(&mut self) -> anyhow::Result<Vec<u8>> {
        let r = self
            .call(
                "Page.captureScreenshot",
                serde_json::json!({"format": "png", "captureBeyondViewport": true}),
            )
            .await?;
        let data = r["data"].as_str().context("no screenshot data")?;
        Ok(base64::engine::general_purpose::STANDARD.decode(data)?)
    }
}
