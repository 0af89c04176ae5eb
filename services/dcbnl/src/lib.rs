//! dcbnl — the rtnetlink DCB interface (IEEE 802.1Qaz PFC, ETS and the APP
//! table) spoken directly from Rust, so the appliance does not need to shell
//! out to iproute2's `dcb` to make a NIC lossless for RoCE.
//!
//! The crate is split in layers that can be tested without hardware:
//!
//! * [`types`]: the kernel's `struct ieee_ets`, `struct ieee_pfc` and
//!   `struct dcb_app` as plain Rust values with exact C-layout (de)serialisation.
//! * [`msg`]: netlink message encoders (byte for byte what `dcb` sends) and
//!   reply decoders.
//! * [`plan`]: the pure read-modify-write logic turning the NIC's current state
//!   and the recipe's [`Desired`] configuration into messages.
//! * [`socket`]: the real I/O over a `NETLINK_ROUTE` socket.
//!
//! Numeric values and layouts come from `include/uapi/linux/dcbnl.h` and
//! `include/uapi/linux/rtnetlink.h`.

pub mod msg;
pub mod plan;
pub mod socket;
pub mod types;

pub use msg::{
    NlMessage, Reply, Request, decode_get_response, decode_reply, decode_set_response, encode_app_add, encode_app_del,
    encode_ets_set, encode_get_request, encode_pfc_set, split_messages,
};
pub use plan::{Desired, plan};
pub use socket::{Report, Socket};
pub use types::{App, Ieee, IeeeEts, IeeePfc};

/// Kernel constants, named as in the uapi headers so they can be grepped.
pub mod consts {
    /// `RTM_GETDCB` from rtnetlink.h.
    pub const RTM_GETDCB: u16 = 78;
    /// `RTM_SETDCB`; the kernel requires CAP_NET_ADMIN for this type, and
    /// IEEE_DEL is sent with it too (there is no RTM_DELDCB).
    pub const RTM_SETDCB: u16 = 79;

    pub const NLMSG_NOOP: u16 = 1;
    pub const NLMSG_ERROR: u16 = 2;
    pub const NLMSG_DONE: u16 = 3;

    pub const NLM_F_REQUEST: u16 = 0x1;
    pub const NLM_F_ACK: u16 = 0x4;

    /// Attribute type flags that must be masked off before comparing types:
    /// libmnl sets NLA_F_NESTED on nests it sends, the kernel does not on the
    /// nests it replies with.
    pub const NLA_F_NESTED: u16 = 0x8000;
    pub const NLA_F_NET_BYTEORDER: u16 = 0x4000;
    pub const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

    /// `enum dcbnl_commands`.
    pub const DCB_CMD_IEEE_SET: u8 = 20;
    pub const DCB_CMD_IEEE_GET: u8 = 21;
    pub const DCB_CMD_IEEE_DEL: u8 = 27;

    /// `enum dcbnl_attrs`.
    pub const DCB_ATTR_IFNAME: u16 = 1;
    pub const DCB_ATTR_IEEE: u16 = 13;

    /// `enum ieee_attrs`.
    pub const DCB_ATTR_IEEE_ETS: u16 = 1;
    pub const DCB_ATTR_IEEE_PFC: u16 = 2;
    pub const DCB_ATTR_IEEE_APP_TABLE: u16 = 3;

    /// `enum ieee_attrs_app`.
    pub const DCB_ATTR_IEEE_APP: u16 = 1;

    pub const IEEE_8021QAZ_MAX_TCS: usize = 8;
    pub const IEEE_8021QAZ_TSA_STRICT: u8 = 0;
    pub const IEEE_8021QAZ_TSA_CB_SHAPER: u8 = 1;
    pub const IEEE_8021QAZ_TSA_ETS: u8 = 2;
    pub const IEEE_8021QAZ_TSA_VENDOR: u8 = 255;

    pub const IEEE_8021QAZ_APP_SEL_ETHERTYPE: u8 = 1;
    pub const IEEE_8021QAZ_APP_SEL_STREAM: u8 = 2;
    pub const IEEE_8021QAZ_APP_SEL_DGRAM: u8 = 3;
    pub const IEEE_8021QAZ_APP_SEL_ANY: u8 = 4;
    pub const IEEE_8021QAZ_APP_SEL_DSCP: u8 = 5;

    /// `IFNAMSIZ`, including the terminating NUL.
    pub const IFNAMSIZ: usize = 16;

    /// Kernel-internal `ENOTSUPP` (not in libc): some drivers leak it through
    /// the dcbnl status byte, and it means the same as EOPNOTSUPP to us.
    pub const ENOTSUPP: i32 = 524;
}

/// Everything that can go wrong talking dcbnl.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The interface exists but its driver has no dcbnl ops (every virtual
    /// NIC: virtio, veth, dummy, lo) or does not implement this command.
    /// Kept distinct so callers can treat "no DCB here" as a soft condition.
    #[error("the interface's driver does not support DCB (EOPNOTSUPP)")]
    NotSupported,
    /// The kernel knows no interface of that name.
    #[error("no such network interface (ENODEV)")]
    NoDevice,
    /// Setting DCB needs CAP_NET_ADMIN.
    #[error("permission denied: dcbnl sets need CAP_NET_ADMIN")]
    PermissionDenied,
    /// Any other kernel or driver error code.
    #[error("kernel refused the request: {}", std::io::Error::from_raw_os_error(*errno))]
    Kernel { errno: i32 },
    /// The interface name cannot be sent (empty, too long, contains NUL…).
    #[error("invalid interface name {0:?}")]
    InvalidIfname(String),
    /// A struct attribute had the wrong size for its C layout.
    #[error("{what}: expected {expected} bytes, got {got}")]
    BadLength { what: &'static str, expected: usize, got: usize },
    /// A reply could not be parsed.
    #[error("malformed netlink data: {0}")]
    Malformed(String),
    /// A reply lacked an attribute we need (e.g. a NIC without ETS support).
    #[error("reply lacks {0}")]
    MissingAttribute(&'static str),
    /// The recipe's desired configuration is not valid DCB.
    #[error("invalid desired DCB configuration: {0}")]
    InvalidConfig(String),
    /// After applying, the NIC reports something other than what we set.
    #[error("read-back after apply differs from what was set: {0}")]
    ReadBackMismatch(String),
    /// No answer from the kernel within the socket's receive timeout.
    #[error("timed out waiting for the kernel's dcbnl reply")]
    Timeout,
    /// Socket-level failure.
    #[error("netlink socket: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Maps a positive errno (from NLMSG_ERROR or the dcbnl status byte) to
    /// the variants callers are expected to match on.
    pub fn from_errno(errno: i32) -> Error {
        match errno {
            libc::EOPNOTSUPP | consts::ENOTSUPP => Error::NotSupported,
            libc::ENODEV => Error::NoDevice,
            libc::EPERM | libc::EACCES => Error::PermissionDenied,
            _ => Error::Kernel { errno },
        }
    }
}
