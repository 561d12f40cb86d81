//! The control connection between the router and an isolated child: rare requests
//! (load a library, create or build instances, open a call channel), one JSON message per
//! packet of a `SOCK_SEQPACKET` socket pair, with shared-memory fds passed alongside
//! (`SCM_RIGHTS`). Per-request calls never use it: they go through shared memory.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, socketpair, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use switchyard_plugin_sdk::WorkerType;

/// The largest message either side sends (a type list, a build's parts).
const MAX_MESSAGE: usize = 1 << 20;

/// Parent to child.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Load a library and register its types.
    Load {
        path: std::path::PathBuf,
        sha256: Option<String>,
        revision: crate::plugin::RevisionRule,
        /// Type names already registered in the router, and by whom.
        taken: Vec<(String, String)>,
    },
    /// Create an instance of a component type.
    Create {
        type_name: String,
        params: String,
        /// The router's cost-model knobs handed with the params (ABI 1.5).
        router: Option<switchyard_plugin_sdk::RouterSettings>,
        partition: Partition,
    },
    /// Build a policy type for a partition.
    Build {
        type_name: String,
        params: String,
        router: Option<switchyard_plugin_sdk::RouterSettings>,
        partition: Partition,
        /// Every component type the router has registered (for `add_registered`).
        registered: Vec<String>,
    },
    /// Validate a policy type's parameters (nothing is kept).
    Validate {
        type_name: String,
        params: String,
        router: Option<switchyard_plugin_sdk::RouterSettings>,
    },
    /// Destroy instances (no answer).
    Destroy { ids: Vec<u32> },
    /// Serve calls on the shared-memory region passed with this message.
    OpenChannel { rows: usize, label_bytes: usize },
}

impl Request {
    /// What the child is asked to do, in words (for the report of a death meanwhile).
    pub fn describe(&self) -> String {
        match self {
            Request::Load { path, .. } => {
                format!("loading (constructors) and registering {}", path.display())
            }
            Request::Create { type_name, .. } => format!("creating an instance of `{type_name}`"),
            Request::Build { type_name, .. } => format!("building the policy `{type_name}`"),
            Request::Validate { type_name, .. } => {
                format!("validating parameters of the policy `{type_name}`")
            }
            Request::Destroy { .. } => "destroying instances".into(),
            Request::OpenChannel { .. } => "opening a call channel".into(),
        }
    }
}

/// A component the child created for a policy build, or a registered type it asked for.
#[derive(Debug, Serialize, Deserialize)]
pub enum Part {
    Own {
        id: u32,
        name: String,
        kind: String,
        inputs: u32,
        weight: f64,
        notified: bool,
    },
    Registered {
        type_name: String,
        params: String,
        weight: f64,
    },
}

/// A component type a library registered in the child.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ComponentInfo {
    pub name: String,
    pub kind: String,
    pub inputs: u32,
}

/// Child to parent.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Loaded {
        plugin: Box<crate::plugin::LoadedPlugin>,
        components: Vec<ComponentInfo>,
        policies: Vec<String>,
    },
    /// The loader refused the library: the message `check` prints.
    Refused {
        message: String,
    },
    Created {
        id: u32,
        notified: bool,
    },
    Built {
        parts: Vec<Part>,
    },
    Ok,
    /// A plugin callback failed: its status code and message.
    Failed {
        status: i32,
        message: String,
    },
    /// Plugin log lines (ABI 1.5) the child queued, sent before its answer; the router
    /// logs them and reads on.
    Log {
        lines: Vec<crate::plugin::LogLine>,
    },
}

/// A partition as it crosses.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Partition {
    pub model: String,
    pub worker_type: String,
}

impl Partition {
    pub fn of(key: &crate::plugin::PartitionKey) -> Self {
        Partition {
            model: key.model.clone(),
            worker_type: key.worker_type.as_str().to_owned(),
        }
    }

    pub fn key(&self) -> crate::plugin::PartitionKey {
        let worker_type = WorkerType::ALL
            .into_iter()
            .find(|t| t.as_str() == self.worker_type)
            .unwrap_or(WorkerType::Select);
        crate::plugin::PartitionKey::new(self.model.clone(), worker_type)
    }
}

/// One end of the control connection.
pub struct Connection {
    fd: OwnedFd,
}

impl Connection {
    /// A connected pair (parent end, child end); both close on exec.
    pub fn pair() -> std::io::Result<(Connection, Connection)> {
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        Ok((Connection { fd: a }, Connection { fd: b }))
    }

    /// The end a child inherited as `fd`.
    ///
    /// # Safety
    /// `fd` must be an open socket this process owns and nothing else closes.
    pub unsafe fn inherited(fd: RawFd) -> Connection {
        // SAFETY: per this function's contract.
        Connection {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        }
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Answers taking longer than this fail with a timeout (None: wait forever).
    pub fn set_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        let tv = nix::sys::time::TimeVal::new(
            timeout.map_or(0, |t| t.as_secs() as _),
            timeout.map_or(0, |t| t.subsec_micros() as _),
        );
        setsockopt(&self.fd, sockopt::ReceiveTimeout, &tv)?;
        Ok(())
    }

    pub fn send<T: Serialize>(&self, message: &T, fd: Option<&OwnedFd>) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(message).map_err(std::io::Error::other)?;
        let iov = [IoSlice::new(&bytes)];
        let fds = fd.map(|f| [f.as_raw_fd()]);
        let cmsgs: Vec<ControlMessage<'_>> = fds
            .as_ref()
            .map(|f| vec![ControlMessage::ScmRights(f)])
            .unwrap_or_default();
        sendmsg::<()>(
            self.fd.as_raw_fd(),
            &iov,
            &cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
        Ok(())
    }

    /// The next message and the fd sent with it. End of stream: `UnexpectedEof`.
    pub fn receive<T: DeserializeOwned>(&self) -> std::io::Result<(T, Option<OwnedFd>)> {
        let mut buffer = vec![0u8; MAX_MESSAGE];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let (len, fd) = {
            let mut iov = [IoSliceMut::new(&mut buffer)];
            let message = recvmsg::<()>(
                self.fd.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )?;
            let mut fd = None;
            for cmsg in message.cmsgs()? {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    for raw in fds {
                        // SAFETY: the kernel just installed `raw` in this process for us.
                        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                        fd.get_or_insert(owned);
                    }
                }
            }
            (message.bytes, fd)
        };
        if len == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let message = serde_json::from_slice(&buffer[..len]).map_err(std::io::Error::other)?;
        Ok((message, fd))
    }
}
