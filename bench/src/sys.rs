//! Operating-system plumbing: the fd limit, CPU pinning, finding binaries, and reading a process
//! tree's CPU time and memory from /proc (how the report charges each peer for its work).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// Raises the soft open-files limit to the hard limit (1,000 connections through a proxy need
/// ~3,000 descriptors across client, proxy and backends). Returns the new soft limit.
pub fn raise_nofile() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => {
            if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Err(_) => 0,
    }
}

/// The current soft open-files limit.
pub fn nofile() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(s, _)| s)
        .unwrap_or(0)
}

/// Parses a CPU list such as `0`, `0-1` or `1,3`.
pub fn parse_cpus(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
            out.extend(a..=b);
        } else {
            out.push(part.parse().ok()?);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Pins the calling thread (and so every thread it creates afterwards: call before the runtime
/// is built) to `cpus`.
pub fn pin_self(cpus: &[usize]) -> Result<(), String> {
    use nix::sched::{CpuSet, sched_setaffinity};
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|e| format!("cpu {c}: {e}"))?;
    }
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| e.to_string())
}

/// Online CPUs.
pub fn cpu_count() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// Finds `name` on PATH (also /usr/sbin and /sbin, where nginx and haproxy live but which a
/// non-root PATH often lacks).
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Sends `sig` to `pid`; errors (already gone) are ignored.
pub fn signal(pid: u32, sig: Signal) {
    if let Ok(p) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(Pid::from_raw(p), sig);
    }
}

/// Whether `pid` exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_fields(&s).map(|f| f.state != 'Z'))
        .unwrap_or(false)
}

struct Stat {
    state: char,
    ppid: u32,
    /// utime + stime + cutime + cstime, in clock ticks.
    ticks: u64,
}

fn stat_fields(s: &str) -> Option<Stat> {
    // The command name is in parentheses and may hold spaces: split after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(Stat {
        state: f.first()?.chars().next()?,
        ppid: u32::try_from(num(1)?).ok()?,
        // Fields 14-17 of stat(5) are at 11-14 here (state is field 3).
        ticks: num(11)? + num(12)? + num(13)? + num(14)?,
    })
}

/// `root` and all its descendants alive now.
pub fn tree(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                && let Some(st) = stat_fields(&s)
            {
                children.entry(st.ppid).or_default().push(pid);
            }
        }
    }
    let mut out = vec![root];
    let mut seen = HashSet::from([root]);
    let mut i = 0;
    while i < out.len() {
        for &c in children.get(&out[i]).map_or(&[][..], Vec::as_slice) {
            if seen.insert(c) {
                out.push(c);
            }
        }
        i += 1;
    }
    out.retain(|&p| alive(p));
    out
}

/// Clock ticks per second for /proc times (100 on every Linux we run on; USER_HZ is fixed by the
/// kernel ABI).
const TICKS_PER_SEC: f64 = 100.0;

/// CPU seconds used so far by `root`'s tree: every live process's user + system time plus what
/// its reaped children used (so an nginx worker that exited after a reload still counts, through
/// its master's cutime/cstime).
pub fn tree_cpu_seconds(root: u32) -> f64 {
    tree(root)
        .iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|s| stat_fields(&s))
        .map(|s| s.ticks as f64 / TICKS_PER_SEC)
        .sum()
}

fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

/// Resident memory of `root`'s tree now (bytes; pages shared between an nginx master and its
/// workers are counted in each).
pub fn tree_rss_bytes(root: u32) -> u64 {
    tree(root)
        .iter()
        .map(|&p| status_kb(p, "VmRSS:") * 1024)
        .sum()
}

/// Open file descriptors of `root`'s tree now (sockets, files, pipes).
pub fn tree_fds(root: u32) -> u64 {
    tree(root)
        .iter()
        .map(|&p| std::fs::read_dir(format!("/proc/{p}/fd")).map_or(0, |d| d.count() as u64))
        .sum()
}

/// TCP sockets on this machine whose local port is `port`, listening ones excepted: the
/// connections a server on that port still holds (any state, `TIME_WAIT` included).
pub fn tcp_sockets_on_port(port: u16) -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .map(|t| {
            t.lines()
                .skip(1)
                .filter(|l| {
                    let mut cols = l.split_whitespace();
                    let local = cols.nth(1).unwrap_or("");
                    let state = cols.nth(1).unwrap_or("");
                    state != "0A"
                        && local
                            .rsplit(':')
                            .next()
                            .and_then(|p| u16::from_str_radix(p, 16).ok())
                            == Some(port)
                })
                .count()
        })
        .sum()
}

/// `(local port, state)` of each TCP socket process `pid` holds (sockets in `TIME_WAIT`
/// belong to no process and are not among them).
fn own_tcp(pid: u32) -> Vec<(u16, String)> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy();
            l.strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_string)
        })
        .collect();
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| {
            t.lines()
                .skip(1)
                .filter_map(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    let (local, state, inode) = (cols.get(1)?, cols.get(3)?, cols.get(9)?);
                    if !inodes.contains(*inode) {
                        return None;
                    }
                    let port = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
                    Some((port, (*state).to_string()))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Process `pid`'s TCP connections: `(inbound, outbound)`. Inbound ones have a port it
/// listens on as their local port (its clients', in any state but listening); outbound ones
/// are established from any other port (a proxy's upstream connections). Read from the
/// process's socket descriptors and `/proc/net/tcp{,6}`, so nothing else on the machine is
/// counted.
pub fn connections(pid: u32) -> (usize, usize) {
    by_direction(&own_tcp(pid))
}

/// `(inbound, outbound)` of a process's `(local port, state)` sockets (see [`connections`]).
fn by_direction(own: &[(u16, String)]) -> (usize, usize) {
    // 0A: LISTEN; 01: ESTABLISHED.
    let listening: std::collections::HashSet<u16> = own
        .iter()
        .filter(|(_, s)| s == "0A")
        .map(|(p, _)| *p)
        .collect();
    let inbound = own
        .iter()
        .filter(|(p, s)| s != "0A" && listening.contains(p))
        .count();
    let outbound = own
        .iter()
        .filter(|(p, s)| s == "01" && !listening.contains(p))
        .count();
    (inbound, outbound)
}

/// Peak resident memory (VmHWM) of one process (bytes).
pub fn peak_rss_bytes(pid: u32) -> u64 {
    status_kb(pid, "VmHWM:") * 1024
}

/// This process's CPU seconds (user + system).
pub fn self_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| stat_fields(&s))
        .map_or(0.0, |s| s.ticks as f64 / TICKS_PER_SEC)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cpus_and_stat() {
        assert_eq!(parse_cpus("0-2,5"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpus("x"), None);
        let me = std::process::id();
        assert!(tree(me).contains(&me));
        assert!(peak_rss_bytes(me) > 0);
        assert!(self_cpu_seconds() >= 0.0);
    }

    #[test]
    fn connections_are_this_process_s_own_by_direction() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_accepted, _) = l.accept().unwrap();
        let mine = c.local_addr().unwrap().port();
        // Other tests of this process open sockets too: look for these by port.
        let own = own_tcp(std::process::id());
        let state = |p: u16| -> Vec<&str> {
            own.iter()
                .filter(|(q, _)| *q == p)
                .map(|(_, s)| s.as_str())
                .collect()
        };
        let mut on_listener = state(port);
        on_listener.sort_unstable();
        assert_eq!(
            on_listener,
            ["01", "0A"],
            "the listener and the accepted side"
        );
        assert_eq!(state(mine), ["01"], "the connected side");
        let ours: Vec<(u16, String)> = own
            .into_iter()
            .filter(|(p, _)| *p == port || *p == mine)
            .collect();
        // The accepted side has the listener's port: inbound; the connected side: outbound.
        assert_eq!(by_direction(&ours), (1, 1));
        drop(c);
    }
}
