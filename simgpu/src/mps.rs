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
/// Static SM partitioning mode (`-S`, `--static-partitioning`; MPS docs,
/// Legacy MPS v2 Interface): set at the daemon's start only.
pub const STATIC_FLAGS: [&str; 2] = ["-S", "--static-partitioning"];
/// The partition a client binds to, by the id `sm_partition add` printed.
pub const ENV_PARTITION: &str = "CUDA_MPS_SM_PARTITION";
pub const ENV_PIPE: &str = "CUDA_MPS_PIPE_DIRECTORY";
pub const ENV_LOG: &str = "CUDA_MPS_LOG_DIRECTORY";
pub const ENV_PCT: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
pub const ENV_MEM: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
pub const ENV_PRIO: &str = "CUDA_MPS_CLIENT_PRIORITY";

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
        ["ok", server, pct, mem, sms] => Ok(ConnectReply::Ok(Grant {
            server: server.parse().unwrap_or(0),
            thread_pct: pct.parse().ok(),
            mem: MemLimits::decode(mem),
            sms: sms.parse().ok(),
        })),
        ["wait"] => Ok(ConnectReply::Wait),
        ["no_partition"] => Ok(ConnectReply::NoPartition),
        _ => Err(std::io::Error::other(format!("bad MPS reply {r:?}"))),
    }
}

pub fn terminated_marker(pipe_dir: &Path, pid: i32) -> PathBuf {
    pipe_dir.join("terminated").join(pid.to_string())
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

/// The daemon's state; `run` serves until `quit`.
pub struct Daemon {
    pub pipe_dir: PathBuf,
    pub log_dir: PathBuf,
    pub multiuser: bool,
    /// Started with `-S`: every client must name a partition.
    pub static_partitioning: bool,
    /// The GPUs it may partition (its visible devices).
    pub devices: Vec<Device>,
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
            partitions: Vec::new(),
            next_partition: 1,
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
        }
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
            "Starting control daemon (multiuser={}, static_partitioning={}, default_active_thread_percentage={:?})",
            self.multiuser, self.static_partitioning, self.default_pct
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
        let (reply, quit) = self.handle_ui(line);
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
                        let _ = std::fs::write(terminated_marker(&self.pipe_dir, c), b"");
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
                    self.control_log(&format!(
                        "NEW CLIENT {pid} from user {uid}: Server {} of user {} is busy; client waits",
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
        let s = &mut self.servers[i];
        s.clients.push(pid);
        let (spid, pct, mem) = (s.pid, s.thread_pct, s.mem.encode());
        self.server_log(spid, &format!("New client {pid} connected"));
        format!(
            "ok {spid} {} {mem} {}\n",
            pct.map_or("-".to_string(), |p| p.to_string()),
            sms.map_or("-".to_string(), |n| n.to_string())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
