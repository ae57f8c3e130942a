//! Fake MPS control daemon and its client protocol.
//!
//! The real daemon talks over named pipes in CUDA_MPS_PIPE_DIRECTORY; this one
//! listens on a unix socket `<pipe dir>/control` and speaks lines. User
//! commands are the real `nvidia-cuda-mps-control` ones. The fake libcuda
//! sends internal `@connect`, `@disconnect`, `@fault` lines. A "server" is a
//! real child process (so its pid can be signalled and shows in `ps`), one per
//! user id, or a single one in multi-user mode.
//!
//! Like the real daemon (sources in simgpu/README.md, "MPS control daemon"):
//! * every user can reach the control socket (clients of every user must),
//!   and user commands are accepted whoever sends them: NVIDIA documents no
//!   per-user check on them;
//! * `control.log` holds the daemon's own notices and every user command
//!   with its reply (`NEW UI`, `Cmd:<command>`, the reply lines, `UI
//!   closed`): text a user chooses lands there; `server.log` holds the
//!   server's notices and its clients' status, no user text;
//! * a client's identity is the connection's credentials (SO_PEERCRED), not
//!   what it claims: a mismatch is logged as "User did not send valid
//!   credentials" and refused, and a fault is reported only by the client
//!   itself (in the real driver the server sees the fault; here the faulting
//!   client's fake libcuda tells it).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// NVIDIA's documented flag for multi-user server mode (MPS docs,
/// "Provisioning sequence"): clients of every user share one root server.
pub const MULTIUSER_FLAG: &str = "-multiuser-server";
/// Every spelling of it the 13000 binary accepted (its help lists `-M,
/// --multiuser-server`; the documented one started a daemon too).
pub const MULTIUSER_FLAGS: [&str; 3] = [MULTIUSER_FLAG, "-M", "--multiuser-server"];
/// MPS v3's multi-user flags (MPS v3 Interface: "-m, --multiuser").
pub const V3_MULTIUSER_FLAGS: [&str; 2] = ["-m", "--multiuser"];
/// The control daemon version with MPS v3 (`-p 3`; CUDA 13.4, r615) and
/// the one that routes clients of the main socket by cgroup (r620; its
/// CUDA number is a guess, as muxflow's `mps_v3` guesses it).
pub const V3_MIN_VERSION: u32 = 13040;
pub const V3_CGROUP_ROUTING_MIN_VERSION: u32 = 13050;
/// Static SM partitioning mode (`-S`, `--static-partitioning`; MPS docs,
/// Legacy MPS v2 Interface): set at the daemon's start only.
pub const STATIC_FLAGS: [&str; 2] = ["-S", "--static-partitioning"];
/// The control daemon version with static partitioning (CUDA 13.1).
pub const STATIC_MIN_VERSION: u32 = 13010;
/// The partition a client binds to, by the id `sm_partition add` printed.
pub const ENV_PARTITION: &str = "CUDA_MPS_SM_PARTITION";
pub const ENV_PIPE: &str = "CUDA_MPS_PIPE_DIRECTORY";
pub const ENV_LOG: &str = "CUDA_MPS_LOG_DIRECTORY";
pub const ENV_PCT: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
pub const ENV_MEM: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
pub const ENV_PRIO: &str = "CUDA_MPS_CLIENT_PRIORITY";
pub const ENV_VISIBLE: &str = "CUDA_VISIBLE_DEVICES";

/// Parses "8G", "512M", "1024K", "4096" (bytes) — binary units like MPS.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1u64 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        'T' | 't' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok().map(|n| n * mult)
}

/// Pinned device memory limits: a default and per-device overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemLimits {
    pub all: Option<u64>,
    pub per_dev: BTreeMap<u32, u64>,
}

impl MemLimits {
    /// "0=8G,1=512M" or a single value for every device.
    pub fn parse(s: &str) -> Option<Self> {
        let mut m = MemLimits::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some((d, v)) => {
                    m.per_dev.insert(d.trim().parse().ok()?, parse_size(v)?);
                }
                None => m.all = Some(parse_size(part)?),
            }
        }
        Some(m)
    }

    pub fn get(&self, dev: u32) -> Option<u64> {
        self.per_dev.get(&dev).copied().or(self.all)
    }

    /// Serialized in bytes ("*=N" for the default), "-" when empty.
    pub fn encode(&self) -> String {
        let mut parts: Vec<String> = self.all.iter().map(|v| format!("*={v}")).collect();
        parts.extend(self.per_dev.iter().map(|(d, v)| format!("{d}={v}")));
        if parts.is_empty() {
            "-".into()
        } else {
            parts.join(",")
        }
    }

    pub fn decode(s: &str) -> Self {
        let mut m = MemLimits::default();
        for p in s.split(',') {
            if let Some((d, v)) = p.split_once('=') {
                let Ok(v) = v.parse() else { continue };
                if d == "*" {
                    m.all = Some(v);
                } else if let Ok(d) = d.parse() {
                    m.per_dev.insert(d, v);
                }
            }
        }
        m
    }

    /// The tighter of two limits per device.
    pub fn tighten(&self, other: &MemLimits, dev: u32) -> Option<u64> {
        match (self.get(dev), other.get(dev)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// MPS v3 names: lowercase letters, digits and underscores, up to 64
/// (MPS v3 Interface).
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

pub fn socket_path(pipe_dir: &Path) -> PathBuf {
    pipe_dir.join("control")
}

/// Sends one line, returns the whole reply.
pub fn request(pipe_dir: &Path, line: &str) -> std::io::Result<String> {
    let mut s = UnixStream::connect(socket_path(pipe_dir))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    s.write_all(line.as_bytes())?;
    s.write_all(b"\n")?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// What a connecting client gets from its server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub server: i32,
    pub thread_pct: Option<u32>,
    pub mem: MemLimits,
    /// The SMs of the client's static partition (static mode only).
    pub sms: Option<u32>,
    /// The MPS v3 namespace the client was routed to (a v3 daemon's,
    /// other than a server's default): its `thread_pct` overrides the
    /// client's own variable, its `mem` is only tightened by it.
    pub namespace: Option<String>,
    /// The namespace's client priority: the client's if it sets none.
    pub default_priority: Option<u32>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum ConnectReply {
    Ok(Grant),
    /// A server of another user is busy (no multi-user mode): wait, like real MPS.
    Wait,
    /// Static partitioning mode and no valid partition named.
    NoPartition,
}

/// `partition`: the client's `CUDA_MPS_SM_PARTITION`, if any.
pub fn connect(
    pipe_dir: &Path,
    pid: i32,
    uid: u32,
    partition: Option<&str>,
) -> std::io::Result<ConnectReply> {
    let part = partition
        .map(str::trim)
        .filter(|p| !p.is_empty() && !p.contains(char::is_whitespace))
        .unwrap_or("-");
    let r = request(pipe_dir, &format!("@connect {pid} {uid} {part}"))?;
    let w: Vec<&str> = r.split_whitespace().collect();
    match w.as_slice() {
        ["ok", server, pct, mem, sms, ns, prio] => Ok(ConnectReply::Ok(Grant {
            server: server.parse().unwrap_or(0),
            thread_pct: pct.parse().ok(),
            mem: MemLimits::decode(mem),
            sms: sms.parse().ok(),
            namespace: (*ns != "-").then(|| ns.to_string()),
            default_priority: prio.parse().ok(),
        })),
        ["wait"] => Ok(ConnectReply::Wait),
        ["no_partition"] => Ok(ConnectReply::NoPartition),
        _ => Err(std::io::Error::other(format!("bad MPS reply {r:?}"))),
    }
}

/// The `CUDA_VISIBLE_DEVICES` the daemon of `pipe_dir` was started with
/// (None: unset), which decides what its clients see (`crate::visible`).
pub fn daemon_devices(pipe_dir: &Path, pid: i32) -> std::io::Result<Option<String>> {
    let r = request(pipe_dir, &format!("@devices {pid}"))?;
    match r.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["devices", "-"] => Ok(None),
        ["devices", spec] => Ok(Some(spec.to_string())),
        _ => Err(std::io::Error::other(format!("bad MPS reply {r:?}"))),
    }
}

/// Is cgroup `cg` the cgroup `bound` or one below it? Both are paths as a
/// cgroup namespace shows them; the dev cluster runs each slurmd in a
/// namespace of its own, so a daemon started outside it (a test's own
/// health step) sees the job's path with that namespace's root before it:
/// `bound` may start at any component of `cg`.
fn cgroup_within(cg: &str, bound: &str) -> bool {
    let bound = bound.trim_end_matches('/');
    if bound.is_empty() || !bound.starts_with('/') {
        return false;
    }
    // `bound` starts with '/': every match starts at a component.
    cg.match_indices(bound).any(|(i, _)| {
        let rest = &cg[i + bound.len()..];
        rest.is_empty() || rest.starts_with('/')
    })
}

/// Where the daemon tells client `pid` that it was terminated. The daemon
/// makes it empty when the client connects; the client opens it then and
/// keeps it open, and `terminate_client` writes into it: like the real
/// client's connection, it keeps reaching the client after its user can
/// no longer enter the pipe directory (muxflow's ACL, once its job ended).
pub fn terminated_marker(pipe_dir: &Path, pid: i32) -> PathBuf {
    pipe_dir.join("terminated").join(pid.to_string())
}

/// Has the daemon terminated the client whose marker this is (opened at
/// connect, [`terminated_marker`])?
pub fn is_terminated(marker: &std::fs::File) -> bool {
    marker.metadata().is_ok_and(|m| m.len() > 0)
}

/// The credentials of the process at the other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
}

/// SO_PEERCRED of a connected unix socket.
pub fn peer_of(conn: &UnixStream) -> Option<Peer> {
    use std::os::fd::AsRawFd;
    // SAFETY: getsockopt writes at most `len` bytes into the ucred we own.
    let cred = unsafe {
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        let rc = libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        );
        if rc != 0 {
            return None;
        }
        cred
    };
    Some(Peer {
        pid: cred.pid,
        uid: cred.uid,
    })
}

/// Timestamp like the real MPS logs: `[2024-01-02 03:04:05.678`.
fn stamp() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as libc::time_t;
    // SAFETY: gmtime_r fills the tm we own from a valid time_t.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::gmtime_r(&secs, &mut tm);
        tm
    };
    format!(
        "[{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        d.subsec_millis()
    )
}

fn log_to(path: &Path, who: &str, pid: i32, msg: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{} {who} {pid}] {msg}", stamp());
    }
}

struct Server {
    pid: i32,
    uid: u32,
    thread_pct: Option<u32>,
    mem: MemLimits,
    clients: Vec<i32>,
    sticky: Vec<i32>,
}

/// A device the daemon can partition: its UUID, SM count and chunk size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub uuid: String,
    pub sm_count: u32,
    pub sm_per_chunk: u32,
}

impl Device {
    pub fn chunks(&self) -> u32 {
        self.sm_count / self.sm_per_chunk.max(1)
    }
}

/// A static SM partition: `<uuid>/<opaque>` as NVIDIA prints it.
struct Partition {
    id: String,
    uuid: String,
    chunks: u32,
    sms: u32,
    clients: Vec<i32>,
}

/// An MPS v3 namespace of a named server (MPS v3 Namespaces).
struct Namespace {
    name: String,
    server: String,
    pct: Option<u32>,
    mem: Option<u64>,
    priority: Option<u32>,
    /// The cgroup routed to it (the guessed `--cgroup=` option).
    cgroup: Option<String>,
}

/// A daemon started with `-p 3`: what it adds to a v2 one.
#[derive(Default)]
pub struct V3 {
    /// Routes clients of the main socket by their cgroup (r620).
    pub cgroup_routing: bool,
    servers: Vec<String>,
    namespaces: Vec<Namespace>,
}

/// The daemon's state; `run` serves until `quit`.
pub struct Daemon {
    /// Started with `-p 3`: speaks only v3's grammar.
    pub v3: Option<V3>,
    pub pipe_dir: PathBuf,
    pub log_dir: PathBuf,
    pub multiuser: bool,
    /// Started with `-S`: every client must name a partition.
    pub static_partitioning: bool,
    /// The GPUs it may partition (its visible devices).
    pub devices: Vec<Device>,
    /// The `CUDA_VISIBLE_DEVICES` it was started with (None: unset): its
    /// clients see those devices, renumbered from 0 (`crate::visible`).
    pub visible: Option<String>,
    partitions: Vec<Partition>,
    next_partition: u32,
    default_pct: Option<u32>,
    default_mem: MemLimits,
    servers: Vec<Server>,
    pid: i32,
}

fn spawn_server() -> std::io::Result<i32> {
    // SAFETY: the daemon is single-threaded; the child only calls
    // async-signal-safe functions (prctl, getppid, close, pause, _exit).
    unsafe {
        let parent = libc::getpid();
        match libc::fork() {
            -1 => Err(std::io::Error::last_os_error()),
            0 => {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
                // Drop inherited sockets (the client connection being served
                // must see EOF when the daemon closes it).
                for fd in 3..1024 {
                    libc::close(fd);
                }
                loop {
                    libc::pause();
                }
            }
            pid => Ok(pid),
        }
    }
}

impl Daemon {
    pub fn new(pipe_dir: PathBuf, log_dir: PathBuf, multiuser: bool) -> Self {
        Daemon {
            v3: None,
            pipe_dir,
            log_dir,
            multiuser,
            default_pct: std::env::var(ENV_PCT)
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            default_mem: std::env::var(ENV_MEM)
                .ok()
                .and_then(|v| MemLimits::parse(&v))
                .unwrap_or_default(),
            servers: Vec::new(),
            static_partitioning: false,
            devices: Vec::new(),
            visible: std::env::var(ENV_VISIBLE).ok(),
            partitions: Vec::new(),
            next_partition: 1,
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
        }
    }

    /// Speaking MPS v3 (`-p 3`), routing by cgroup where `cgroup_routing`.
    pub fn with_v3(mut self, cgroup_routing: bool) -> Self {
        self.v3 = Some(V3 {
            cgroup_routing,
            ..V3::default()
        });
        self
    }

    /// In static SM partitioning mode, over `devices`.
    pub fn with_static_partitions(mut self, devices: Vec<Device>) -> Self {
        self.static_partitioning = true;
        self.devices = devices;
        self
    }

    fn control_log(&self, msg: &str) {
        log_to(&self.log_dir.join("control.log"), "Control", self.pid, msg);
    }
    fn server_log(&self, spid: i32, msg: &str) {
        log_to(&self.log_dir.join("server.log"), "Server", spid, msg);
    }

    /// Serves requests until `quit`. The socket must not exist yet.
    pub fn run(mut self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.pipe_dir)?;
        std::fs::create_dir_all(&self.log_dir)?;
        std::fs::create_dir_all(self.pipe_dir.join("terminated"))?;
        let sock = socket_path(&self.pipe_dir);
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock)?;
        // Like the real daemon's pipes: every user may connect; which uid a
        // server serves is the daemon's decision, not the socket's.
        std::fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
        std::fs::write(
            self.pipe_dir.join("nvidia-cuda-mps-control.pid"),
            format!("{}\n", self.pid),
        )?;
        // SAFETY: ignoring SIGCHLD makes the kernel reap exited servers.
        unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
        self.control_log(&format!(
            "Starting control daemon (multiuser={}, static_partitioning={}, protocol={}, cgroup_routing={}, default_active_thread_percentage={:?})",
            self.multiuser,
            self.static_partitioning,
            if self.v3.is_some() { 3 } else { 2 },
            self.v3.as_ref().is_some_and(|v| v.cgroup_routing),
            self.default_pct
        ));
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            self.control_log("Accepting connection...");
            let Some(peer) = peer_of(&conn) else {
                self.control_log("User did not send valid credentials");
                continue;
            };
            let mut line = String::new();
            if BufReader::new(&conn).read_line(&mut line).is_err() {
                continue;
            }
            let line = line.trim().to_string();
            let (reply, quit) = self.handle(&line, peer);
            let _ = conn.write_all(reply.as_bytes());
            drop(conn);
            if quit {
                break;
            }
        }
        for s in &self.servers {
            self.server_log(s.pid, "Server exiting");
            // SAFETY: signalling our own child server.
            unsafe { libc::kill(s.pid, libc::SIGTERM) };
        }
        let _ = std::fs::remove_file(&sock);
        let _ = std::fs::remove_file(self.pipe_dir.join("nvidia-cuda-mps-control.pid"));
        self.control_log("Exit");
        Ok(())
    }

    fn prune(&mut self) {
        let mut gone = Vec::new();
        for s in &mut self.servers {
            s.clients.retain(|&c| {
                let alive = crate::shared::pid_alive(c);
                if !alive {
                    gone.push((s.pid, c));
                }
                alive
            });
        }
        for (spid, c) in gone {
            self.client_gone(spid, c, "exited");
        }
        for p in &mut self.partitions {
            p.clients.retain(|&c| crate::shared::pid_alive(c));
        }
    }

    fn client_gone(&mut self, spid: i32, c: i32, how: &str) {
        self.server_log(spid, &format!("Client {c} {how}; disconnected"));
        let _ = std::fs::remove_file(terminated_marker(&self.pipe_dir, c));
        let mut recovered = false;
        if let Some(s) = self.servers.iter_mut().find(|s| s.pid == spid) {
            s.clients.retain(|&x| x != c);
            for p in &mut self.partitions {
                p.clients.retain(|&x| x != c);
            }
            let had = !s.sticky.is_empty();
            s.sticky.retain(|&x| x != c && crate::shared::pid_alive(x));
            recovered = had && s.sticky.is_empty();
        }
        if recovered {
            self.server_log(spid, "All clients with a sticky error have exited; server has recovered from the fatal GPU error");
        }
    }

    /// Handles one line from `peer`; returns (reply, quit). User commands
    /// are logged as the real daemon logs them, with their reply.
    pub fn handle(&mut self, line: &str, peer: Peer) -> (String, bool) {
        if line.starts_with('@') {
            return (self.handle_client(line, peer), false);
        }
        crate::state::append_line(&self.log_dir.join("commands.log"), line);
        self.control_log("NEW UI");
        self.control_log(&format!("Cmd:{line}"));
        let (reply, quit) = if self.v3.is_some() {
            self.handle_v3(line)
        } else {
            self.handle_ui(line)
        };
        for l in reply.lines() {
            self.control_log(l);
        }
        self.control_log("UI closed");
        (reply, quit)
    }

    /// The fake libcuda's internal lines: the connection's credentials
    /// decide who the client is.
    fn handle_client(&mut self, line: &str, peer: Peer) -> String {
        let w: Vec<&str> = line.split_whitespace().collect();
        self.prune();
        let claimed: Option<i32> = w.get(1).and_then(|p| p.parse().ok());
        if claimed != Some(peer.pid) {
            self.control_log("User did not send valid credentials");
            return "error credentials\n".into();
        }
        let pid = peer.pid;
        match w.as_slice() {
            ["@connect", _, _, part] => {
                let part = (*part != "-").then_some(*part);
                self.connect(pid, peer.uid, part)
            }
            ["@devices", _] => format!("devices {}\n", self.visible.as_deref().unwrap_or("-")),
            ["@disconnect", _] => {
                if let Some(s) = self.servers.iter().find(|s| s.clients.contains(&pid)) {
                    let spid = s.pid;
                    self.client_gone(spid, pid, "released its contexts");
                }
                "ok\n".into()
            }
            ["@fault", _, code, ..] => {
                let Ok(code) = code.parse::<u32>() else {
                    return "error code\n".into();
                };
                if let Some(i) = self.servers.iter().position(|s| s.clients.contains(&pid)) {
                    let spid = self.servers[i].pid;
                    let clients = self.servers[i].clients.clone();
                    self.servers[i].sticky = clients.clone();
                    self.server_log(spid, &format!("Client {pid} hit error {code}"));
                    self.server_log(spid, "Server is handling a fatal GPU error.");
                    let list: Vec<String> = clients.iter().map(|c| c.to_string()).collect();
                    self.server_log(
                        spid,
                        &format!(
                            "The following clients have a sticky error set: {}",
                            list.join(", ")
                        ),
                    );
                }
                "ok\n".into()
            }
            _ => "error unknown\n".into(),
        }
    }

    /// A user command of `nvidia-cuda-mps-control`.
    fn handle_ui(&mut self, line: &str) -> (String, bool) {
        let w: Vec<&str> = line.split_whitespace().collect();
        self.prune();
        let find = |servers: &[Server], spid: &str| -> Option<usize> {
            let spid: i32 = spid.parse().ok()?;
            servers.iter().position(|s| s.pid == spid)
        };
        let pct = |s: &str| s.parse::<u32>().ok().filter(|p| (1..=100).contains(p));
        let reply = match w.as_slice() {
            ["quit"] => return (String::new(), true),
            ["get_server_list"] => self
                .servers
                .iter()
                .map(|s| format!("{}\n", s.pid))
                .collect(),
            ["get_client_list", spid] => match find(&self.servers, spid) {
                Some(i) => self.servers[i]
                    .clients
                    .iter()
                    .map(|c| format!("{c}\n"))
                    .collect(),
                None => "Server not found\n".into(),
            },
            ["get_default_active_thread_percentage"] => {
                format!("{:.1}\n", self.default_pct.unwrap_or(100) as f64)
            }
            ["set_default_active_thread_percentage", p] => match pct(p) {
                Some(p) => {
                    self.default_pct = Some(p);
                    format!("{:.1}\n", p as f64)
                }
                None => "Invalid percentage\n".into(),
            },
            ["set_active_thread_percentage", spid, p] => {
                match (find(&self.servers, spid), pct(p)) {
                    (Some(i), Some(p)) => {
                        self.servers[i].thread_pct = Some(p);
                        format!("{:.1}\n", p as f64)
                    }
                    (None, _) => "Server not found\n".into(),
                    _ => "Invalid percentage\n".into(),
                }
            }
            ["set_default_device_pinned_mem_limit", dev, v] => match (dev.parse(), parse_size(v)) {
                (Ok(d), Some(b)) => {
                    self.default_mem.per_dev.insert(d, b);
                    String::new()
                }
                _ => "Invalid arguments\n".into(),
            },
            ["set_device_pinned_mem_limit", spid, dev, v] => {
                match (find(&self.servers, spid), dev.parse(), parse_size(v)) {
                    (Some(i), Ok(d), Some(b)) => {
                        self.servers[i].mem.per_dev.insert(d, b);
                        String::new()
                    }
                    (None, _, _) => "Server not found\n".into(),
                    _ => "Invalid arguments\n".into(),
                }
            }
            ["terminate_client", spid, cpid] => {
                match (find(&self.servers, spid), cpid.parse::<i32>()) {
                    (Some(i), Ok(c)) if self.servers[i].clients.contains(&c) => {
                        let _ = std::fs::OpenOptions::new()
                            .append(true)
                            .create(true)
                            .open(terminated_marker(&self.pipe_dir, c))
                            .and_then(|mut f| f.write_all(b"t"));
                        self.server_log(self.servers[i].pid, &format!("Terminating client {c}"));
                        String::new()
                    }
                    _ => "Client not found\n".into(),
                }
            }
            ["sm_partition", "add", uuid, chunks] => self.partition_add(uuid, chunks),
            ["sm_partition", "rm", uuid, id] => self.partition_rm(uuid, id),
            ["lspart"] => self.lspart(),
            _ => format!("Unknown command: {line}\n"),
        };
        (reply, false)
    }

    /// A command of a v3 daemon (`module verb [args] [--options]`: MPS v3
    /// Interface), the subset muxflow sends. Those that do what a v2
    /// command does are answered by it; the spellings of those are guesses
    /// (muxflow's `mps_v3::spell`); a v2 command is unknown here, as every
    /// invocation follows the running daemon's protocol.
    fn handle_v3(&mut self, line: &str) -> (String, bool) {
        let w: Vec<&str> = line.split_whitespace().collect();
        let opt = |key: &str| -> Option<&str> {
            w.iter()
                .find_map(|a| a.strip_prefix("--")?.strip_prefix(key)?.strip_prefix('='))
        };
        let reply = match w.as_slice() {
            ["quit"] => return (String::new(), true),
            ["server", "list"] => return self.handle_ui("get_server_list"),
            ["client", "list", ..] => match opt("server-pid") {
                Some(p) => return self.handle_ui(&format!("get_client_list {p}")),
                None => "Missing --server-pid\n".into(),
            },
            ["client", "terminate", c, ..] => match opt("server-pid") {
                Some(p) => return self.handle_ui(&format!("terminate_client {p} {c}")),
                None => "Missing --server-pid\n".into(),
            },
            ["server", "create", name, ..] => {
                let v3 = self.v3.as_mut().expect("v3 daemon");
                if !valid_name(name) {
                    format!("Invalid server name {name}\n")
                } else if v3.servers.iter().any(|s| s == name) {
                    format!("Server {name} already exists\n")
                } else {
                    v3.servers.push(name.to_string());
                    format!("Server {name} created\n")
                }
            }
            ["server", "get", name, "active_thread_percentage"] if self.has_server(name) => {
                return self.handle_ui("get_default_active_thread_percentage")
            }
            ["server", "set", name, ..] if self.has_server(name) => {
                match opt("active-thread-percentage") {
                    Some(p) => {
                        return self.handle_ui(&format!("set_default_active_thread_percentage {p}"))
                    }
                    None => "Nothing to set\n".into(),
                }
            }
            ["namespace", "list", ..] => {
                let v3 = self.v3.as_ref().expect("v3 daemon");
                v3.namespaces
                    .iter()
                    .map(|n| format!("{} server={}\n", n.name, n.server))
                    .collect()
            }
            ["namespace", verb @ ("create" | "set" | "delete"), name, ..] => {
                match opt("server").filter(|s| self.has_server(s)) {
                    Some(server) => self.namespace(verb, name, server, &opt),
                    None => "Missing or unknown --server\n".into(),
                }
            }
            _ => format!("Unknown command: {line}\n"),
        };
        (reply, false)
    }

    fn has_server(&self, name: &str) -> bool {
        self.v3
            .as_ref()
            .is_some_and(|v| v.servers.iter().any(|s| s == name))
    }

    /// `namespace create|set|delete <name> --server=<s> [...]`.
    fn namespace<'a>(
        &mut self,
        verb: &str,
        name: &str,
        server: &str,
        opt: &dyn Fn(&str) -> Option<&'a str>,
    ) -> String {
        let v3 = self.v3.as_mut().expect("v3 daemon");
        let at = v3
            .namespaces
            .iter()
            .position(|n| n.name == name && n.server == server);
        match (verb, at) {
            ("create", Some(_)) => format!("Namespace {name} already exists\n"),
            ("create", None) if !valid_name(name) || name == "default" => {
                format!("Invalid namespace name {name}\n")
            }
            ("create", None) => {
                v3.namespaces.push(Namespace {
                    name: name.to_string(),
                    server: server.to_string(),
                    pct: None,
                    mem: None,
                    priority: None,
                    cgroup: None,
                });
                format!("Namespace {name} created\n")
            }
            ("delete", Some(i)) => {
                v3.namespaces.remove(i);
                format!("Namespace {name} deleted\n")
            }
            ("set", Some(i)) => {
                let pct = opt("active-thread-percentage")
                    .map(|p| p.parse::<u32>().ok().filter(|p| (1..=100).contains(p)));
                let mem = opt("pinned-memory-limit").map(parse_size);
                let prio =
                    opt("client-priority").map(|p| p.parse::<u32>().ok().filter(|p| *p <= 1));
                let cgroup = opt("cgroup");
                if matches!(pct, Some(None))
                    || matches!(mem, Some(None))
                    || matches!(prio, Some(None))
                {
                    return "Invalid arguments\n".into();
                }
                if cgroup.is_some() && !v3.cgroup_routing {
                    return "Unknown option --cgroup\n".into();
                }
                let n = &mut v3.namespaces[i];
                n.pct = pct.flatten().or(n.pct);
                n.mem = mem.flatten().or(n.mem);
                n.priority = prio.flatten().or(n.priority);
                n.cgroup = cgroup.map(str::to_string).or(n.cgroup.take());
                String::new()
            }
            (_, None) => format!("Namespace {name} not found\n"),
            _ => "Invalid arguments\n".into(),
        }
    }

    /// The namespace a client of the main socket is routed to on a v3
    /// daemon that routes by cgroup: the one bound to the client's cgroup
    /// or one above it (its `/proc/<pid>/cgroup`; a host without cgroup v2
    /// for the dev cluster: the `job_<id>` of its job by process tree),
    /// else none (its server's default namespace).
    fn routed(&self, pid: i32) -> Option<&Namespace> {
        let v3 = self.v3.as_ref().filter(|v| v.cgroup_routing)?;
        let pid = u32::try_from(pid).ok()?;
        let by_cgroup = crate::dmem::cgroup_of(pid).and_then(|cg| {
            v3.namespaces
                .iter()
                .find(|n| n.cgroup.as_deref().is_some_and(|b| cgroup_within(&cg, b)))
        });
        by_cgroup.or_else(|| {
            let job = crate::dmem::job_of(pid)?;
            let cgroup = format!("/{}/job_{job}", crate::dmem::JOBS_PARENT);
            v3.namespaces
                .iter()
                .find(|n| n.cgroup.as_deref() == Some(cgroup.as_str()))
        })
    }

    /// `sm_partition add <device UUID> <number of chunks>`: `Partition
    /// <id> created` (the form users report NVIDIA's daemon prints).
    fn partition_add(&mut self, uuid: &str, chunks: &str) -> String {
        if !self.static_partitioning {
            return "Static partitioning mode is not enabled (start the daemon with -S)\n".into();
        }
        let Some(dev) = self.devices.iter().find(|d| d.uuid == uuid).cloned() else {
            return format!("Device {uuid} not found\n");
        };
        let Some(chunks) = chunks.parse::<u32>().ok().filter(|&c| c > 0) else {
            return "Invalid number of chunks\n".into();
        };
        let used: u32 = self
            .partitions
            .iter()
            .filter(|p| p.uuid == uuid)
            .map(|p| p.chunks)
            .sum();
        if used + chunks > dev.chunks() {
            return format!(
                "Failed to create partition: {chunks} chunks requested, {} free\n",
                dev.chunks() - used
            );
        }
        let id = format!("{uuid}/p{}", self.next_partition);
        self.next_partition += 1;
        self.partitions.push(Partition {
            id: id.clone(),
            uuid: uuid.to_string(),
            chunks,
            sms: chunks * dev.sm_per_chunk,
            clients: Vec::new(),
        });
        format!("Partition {id} created\n")
    }

    /// `sm_partition rm <device UUID> <partition>`; refused while a client
    /// is bound to it (a guess: NVIDIA does not say).
    fn partition_rm(&mut self, uuid: &str, id: &str) -> String {
        let Some(at) = self
            .partitions
            .iter()
            .position(|p| p.uuid == uuid && p.id == id)
        else {
            return format!("Partition {id} not found\n");
        };
        if !self.partitions[at].clients.is_empty() {
            return format!("Partition {id} is in use\n");
        }
        self.partitions.remove(at);
        format!("Partition {id} removed\n")
    }

    /// `lspart`: per device `<uuid> free chunks F, used chunks U, free SM
    /// FS, used SM US`, then its partitions (the layout users report; a
    /// guess at the exact words).
    fn lspart(&self) -> String {
        let mut out = String::new();
        for d in &self.devices {
            let mine: Vec<&Partition> = self
                .partitions
                .iter()
                .filter(|p| p.uuid == d.uuid)
                .collect();
            let used: u32 = mine.iter().map(|p| p.chunks).sum();
            let free = d.chunks().saturating_sub(used);
            out += &format!(
                "{} free chunks {free}, used chunks {used}, free SM {}, used SM {}\n",
                d.uuid,
                free * d.sm_per_chunk,
                used * d.sm_per_chunk
            );
            for p in mine {
                out += &format!("partition {}: {} chunks, {} SM\n", p.id, p.chunks, p.sms);
            }
        }
        out
    }

    fn connect(&mut self, pid: i32, uid: u32, partition: Option<&str>) -> String {
        // Static mode: a client must name a partition of this daemon.
        let mut sms = None;
        if self.static_partitioning {
            let Some(p) = self
                .partitions
                .iter_mut()
                .find(|p| Some(p.id.as_str()) == partition)
            else {
                self.control_log(&format!(
                    "NEW CLIENT {pid} from user {uid}: no valid {ENV_PARTITION} ({}) in static partitioning mode; refused",
                    partition.unwrap_or("unset")
                ));
                return "no_partition\n".into();
            };
            if !p.clients.contains(&pid) {
                p.clients.push(pid);
            }
            sms = Some(p.sms);
        }
        let want_uid = if self.multiuser { 0 } else { uid };
        let idx = match self
            .servers
            .iter()
            .position(|s| self.multiuser || s.uid == uid)
        {
            Some(i) => {
                self.control_log(&format!(
                    "NEW CLIENT {pid} from user {uid}: Server already exists"
                ));
                Some(i)
            }
            None => {
                // Not multi-user: another user's busy server makes this client wait.
                if let Some(i) = self.servers.iter().position(|s| !s.clients.is_empty()) {
                    // The words of driver 580's daemon (seen on an H200),
                    // which real-gpu/two-users reads.
                    self.control_log(&format!(
                        "NEW CLIENT {pid} from user {uid}: Server is not ready, push client to pending list (server {} of user {} is busy)",
                        self.servers[i].pid, self.servers[i].uid
                    ));
                    return "wait\n".into();
                }
                for s in self.servers.drain(..) {
                    // SAFETY: stopping our own idle child server.
                    unsafe { libc::kill(s.pid, libc::SIGTERM) };
                }
                None
            }
        };
        let i = match idx {
            Some(i) => i,
            None => match spawn_server() {
                Ok(spid) => {
                    self.control_log(&format!("Starting new server {spid} for user {want_uid}"));
                    self.server_log(spid, "Server starting");
                    self.servers.push(Server {
                        pid: spid,
                        uid: want_uid,
                        thread_pct: self.default_pct,
                        mem: self.default_mem.clone(),
                        clients: Vec::new(),
                        sticky: Vec::new(),
                    });
                    self.servers.len() - 1
                }
                Err(e) => return format!("error {e}\n"),
            },
        };
        let (ns, ns_pct, ns_mem, ns_prio) = match self.routed(pid) {
            Some(n) => (n.name.clone(), n.pct, n.mem, n.priority),
            None => ("-".to_string(), None, None, None),
        };
        // Its termination marker, empty: the client opens it now.
        let _ = std::fs::write(terminated_marker(&self.pipe_dir, pid), b"");
        let s = &mut self.servers[i];
        s.clients.push(pid);
        let mut mem = s.mem.clone();
        // A namespace subdivides its server's resources.
        if let Some(b) = ns_mem {
            mem.all = Some(mem.all.map_or(b, |a| a.min(b)));
            for v in mem.per_dev.values_mut() {
                *v = (*v).min(b);
            }
        }
        let (spid, pct, mem) = (s.pid, ns_pct.or(s.thread_pct), mem.encode());
        self.server_log(
            spid,
            &format!("New client {pid} connected (namespace {ns})"),
        );
        format!(
            "ok {spid} {} {mem} {} {ns} {}\n",
            pct.map_or("-".to_string(), |p| p.to_string()),
            sms.map_or("-".to_string(), |n| n.to_string()),
            ns_prio.map_or("-".to_string(), |p| p.to_string())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v3_daemon_speaks_only_v3_and_keeps_namespaces_with_their_limits() {
        let d = tempfile::tempdir().unwrap();
        let me = Peer {
            pid: std::process::id() as i32,
            uid: 0,
        };
        let mut v3 = Daemon::new(d.path().join("p"), d.path().join("l"), true).with_v3(true);
        let mut ui = |line: &str| v3.handle(line, me).0;
        // Every invocation follows the daemon's protocol: v2 is unknown.
        assert!(ui("get_server_list").starts_with("Unknown command"));
        assert_eq!(ui("server list"), "");
        assert!(ui("namespace create job_7 --server=muxflow").contains("unknown --server"));
        assert_eq!(ui("server create muxflow"), "Server muxflow created\n");
        assert_eq!(
            ui("namespace create job_7 --server=muxflow"),
            "Namespace job_7 created\n"
        );
        assert!(ui("namespace create Job-7 --server=muxflow").starts_with("Invalid"));
        assert_eq!(
            ui("namespace set job_7 --server=muxflow --pinned-memory-limit=4096M --active-thread-percentage=30 --client-priority=1"),
            ""
        );
        assert_eq!(
            ui("namespace set job_7 --server=muxflow --active-thread-percentage=130"),
            "Invalid arguments\n"
        );
        assert_eq!(
            ui("namespace set job_7 --server=muxflow --cgroup=/system.slice/slurmstepd.scope/job_7"),
            ""
        );
        assert_eq!(ui("namespace list"), "job_7 server=muxflow\n");
        assert_eq!(
            ui("server set muxflow --active-thread-percentage=100"),
            "100.0\n"
        );
        assert_eq!(ui("server get muxflow active_thread_percentage"), "100.0\n");
        assert_eq!(
            ui("namespace delete job_7 --server=muxflow --force"),
            "Namespace job_7 deleted\n"
        );
        assert_eq!(ui("namespace list"), "");
        let ns = v3.v3.as_ref().unwrap();
        assert!(ns.namespaces.is_empty());
        // Without cgroup routing (r615) there is no --cgroup.
        let mut r615 = Daemon::new(d.path().join("p2"), d.path().join("l2"), true).with_v3(false);
        r615.handle("server create muxflow", me);
        r615.handle("namespace create job_7 --server=muxflow", me);
        let (r, _) = r615.handle("namespace set job_7 --server=muxflow --cgroup=/x", me);
        assert_eq!(r, "Unknown option --cgroup\n");
    }

    #[test]
    fn static_partitions_follow_the_documented_commands() {
        let d = tempfile::tempdir().unwrap();
        let uuid = "GPU-51a0c0de-0000-4000-8000-000001000000";
        let dev = Device {
            uuid: uuid.into(),
            sm_count: 132,
            sm_per_chunk: 4,
        };
        let me = Peer {
            pid: std::process::id() as i32,
            uid: 0,
        };
        let mut plain = Daemon::new(d.path().join("p0"), d.path().join("l0"), true);
        let (r, _) = plain.handle(&format!("sm_partition add {uuid} 4"), me);
        assert!(r.contains("not enabled"), "{r}");
        let mut sd = Daemon::new(d.path().join("p"), d.path().join("l"), true)
            .with_static_partitions(vec![dev]);
        let mut ui = |line: &str| sd.handle(line, me).0;
        assert_eq!(
            ui("lspart"),
            format!("{uuid} free chunks 33, used chunks 0, free SM 132, used SM 0\n")
        );
        assert_eq!(
            ui(&format!("sm_partition add {uuid} 24")),
            format!("Partition {uuid}/p1 created\n")
        );
        assert!(
            ui(&format!("sm_partition add {uuid} 10")).starts_with("Failed"),
            "past the free chunks"
        );
        assert!(ui("sm_partition add GPU-x 1").contains("not found"));
        assert_eq!(
            ui(&format!("sm_partition add {uuid} 9")),
            format!("Partition {uuid}/p2 created\n")
        );
        let listed = ui("lspart");
        assert!(
            listed.starts_with(&format!("{uuid} free chunks 0, used chunks 33,")),
            "{listed}"
        );
        assert!(
            listed.contains(&format!("partition {uuid}/p2: 9 chunks, 36 SM")),
            "{listed}"
        );
        // A client naming no partition, or one that is not there, is refused.
        for part in ["-", "GPU-x/p9"] {
            let (r, _) = sd.handle(&format!("@connect {} 0 {part}", me.pid), me);
            assert_eq!(r, "no_partition\n", "{part}");
        }
        let (r, _) = sd.handle(&format!("sm_partition rm {uuid} {uuid}/p2"), me);
        assert_eq!(r, format!("Partition {uuid}/p2 removed\n"));
        assert!(sd.handle("lspart", me).0.contains("free chunks 9,"));
    }

    #[test]
    fn a_cgroup_is_within_its_own_and_its_ancestors_only() {
        let job = "/system.slice/slurmstepd.scope/s43DM8HQPPH900";
        assert!(cgroup_within(job, job));
        assert!(cgroup_within(&format!("{job}/step_0/user/task_0"), job));
        assert!(!cgroup_within(&format!("{job}0/step_0"), job));
        assert!(!cgroup_within("/system.slice", job));
        assert!(!cgroup_within(job, ""));
        // Seen from outside the dev cluster's namespace of the node.
        assert!(cgroup_within(
            &format!("/muxdev-26800/node3{job}/step_0"),
            job
        ));
        assert!(!cgroup_within(
            &format!("/muxdev-26800/node3{job}x/step_0"),
            job
        ));
    }

    #[test]
    fn sizes_and_limits() {
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("100"), Some(100));
        assert_eq!(parse_size("x"), None);
        let m = MemLimits::parse("0=8G,1=512M").unwrap();
        assert_eq!(m.get(1), Some(512 << 20));
        assert_eq!(m.get(2), None);
        let all = MemLimits::parse("2G").unwrap();
        assert_eq!(all.get(7), Some(2 << 30));
        assert_eq!(MemLimits::decode(&m.encode()), m);
        assert_eq!(m.tighten(&all, 0), Some(2 << 30));
    }
}
