//! Allowlist-only policies (`InstancePolicy::only`) on the request path, against `nvsim`: a
//! short CUDA-like session recorded in audit mode, the names it used turned into an `only`
//! set, the session again in enforce mode with that set (nothing denied), then with one
//! control and with the control escape taken out.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::*;
use ioctl_proxy::*;
use nvproxy_abi::Caps;
use nvproxy_abi::ioctl::nv_iowr;
use nvsim::{SimConfig, SimDriver};

const TOP: u64 = 0x50_0000;
const PARAMS: u64 = 0x60_0000;

/// `NV0000_CTRL_CMD_GPU_GET_PROBED_IDS`.
const PROBED_IDS: u32 = 0x214;
const PROBED_IDS_NAME: &str = "NV0000_CTRL_CMD_GPU_GET_PROBED_IDS";
/// `NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS`.
const ATTACHED_IDS: u32 = 0x201;
const NV_ERR_NOT_SUPPORTED: u32 = 0x56;

struct Session {
    proxy: Proxy,
    events: Arc<Events>,
    mem: FakeMem,
    fds: FakeFds,
}

/// What one call came to: the proxy's return (or errno) and the NV status where it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    ret: Result<i32, i32>,
    status: Option<u32>,
}

impl Session {
    fn new(sim: &Arc<SimDriver>, policy: InstancePolicy) -> Session {
        let events = Arc::new(Events::default());
        Session {
            proxy: Proxy::for_host(policy, sim.clone())
                .unwrap()
                .with_audit(events.clone()),
            events,
            mem: FakeMem::new(),
            fds: FakeFds::default(),
        }
    }

    fn ioctl(&mut self, open: OpenId, cmd: u32, top: &[u8]) -> (Result<i32, i32>, Vec<u8>) {
        self.mem.map(TOP, top);
        self.mem.begin_request();
        let r = self
            .proxy
            .ioctl(open, &CALLER, cmd, TOP, &mut self.mem, &self.fds)
            .map_err(|e| e.errno());
        (r, self.mem.get(TOP, top.len()))
    }

    fn control(&mut self, ctl: OpenId, client: u32, cmd: u32, params: &[u8]) -> Answer {
        let mut p = vec![0u8; 32];
        wr32(&mut p, 0, client);
        wr32(&mut p, 4, client);
        wr32(&mut p, 8, cmd);
        self.mem.map(PARAMS, params);
        wr64(&mut p, 16, PARAMS);
        wr32(&mut p, 24, u32::try_from(params.len()).unwrap());
        let (ret, out) = self.ioctl(ctl, nv_iowr(0x2a, 32), &p);
        Answer {
            status: ret.is_ok().then(|| rd32(&out, 28)),
            ret,
        }
    }

    /// Version check, card info, a root client, two client controls, the client freed.
    /// Returns the answers of the two controls.
    fn run(&mut self) -> (Answer, Answer) {
        let ctl = self.proxy.open(FrontendNode::Ctl).unwrap();
        let mut v = vec![0u8; 72];
        wr32(&mut v, 0, u32::from(b'2'));
        let (r, v) = self.ioctl(ctl, 0xc048_46d2, &v);
        assert_eq!((r, rd32(&v, 4)), (Ok(0), 1));
        let (r, _) = self.ioctl(ctl, nv_iowr(0xc8, 32 * 72), &[0; 32 * 72]);
        assert_eq!(r, Ok(0));
        let mut a = vec![0u8; 48];
        wr32(&mut a, 12, 0x41);
        let (r, out) = self.ioctl(ctl, nv_iowr(0x2b, 48), &a);
        assert_eq!((r, rd32(&out, 40)), (Ok(0), 0));
        let client = rd32(&out, 8);
        let probed = self.control(ctl, client, PROBED_IDS, &[0; 256]);
        let attached = self.control(ctl, client, ATTACHED_IDS, &[0; 128]);
        let mut free = vec![0u8; 16];
        wr32(&mut free, 0, client);
        wr32(&mut free, 8, client);
        let (r, out) = self.ioctl(ctl, nv_iowr(0x29, 16), &free);
        assert_eq!((r, rd32(&out, 12)), (Ok(0), 0));
        self.proxy.release(ctl);
        (probed, attached)
    }
}

fn ok() -> Answer {
    Answer {
        ret: Ok(0),
        status: Some(0),
    }
}

/// The names a session used, from the counts, plus the escapes that carry controls and
/// classes (counted under the controls' and classes' names): what `policy suggest` builds.
fn used_names(proxy: &Proxy) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for row in proxy.counts().snapshot() {
        assert_ne!(row.decision, Decision::Denied, "{row:?}");
        match row.kind {
            Kind::Control => names.insert("NV_ESC_RM_CONTROL".to_owned()),
            Kind::Class => names.insert("NV_ESC_RM_ALLOC".to_owned()),
            _ => false,
        };
        names.insert(row.name);
    }
    names
}

fn only(names: &BTreeSet<String>) -> InstancePolicy {
    // Caps that enable nothing: the set alone decides.
    let mut p = InstancePolicy::new("t", Caps::NONE, vec![0]);
    p.only = Some(names.clone());
    p
}

#[test]
fn test_the_used_names_as_only_set_allow_exactly_the_session() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut policy = InstancePolicy::new("t", Caps::COMPUTE_UTILITY, vec![0]);
    policy.mode = Mode::Audit;
    let mut audit = Session::new(&sim, policy);
    assert_eq!(audit.run(), (ok(), ok()));
    let names = used_names(&audit.proxy);
    for n in [
        "NV_ESC_CHECK_VERSION_STR",
        "NV_ESC_CARD_INFO",
        "NV_ESC_RM_ALLOC",
        "NV_ESC_RM_CONTROL",
        "NV_ESC_RM_FREE",
        "NV01_ROOT_CLIENT",
        PROBED_IDS_NAME,
    ] {
        assert!(names.contains(n), "{n} not in {names:?}");
    }

    // Enforce mode, exactly those names, no caps: the same session, nothing refused.
    let mut exact = Session::new(&sim, only(&names));
    assert_eq!(exact.run(), (ok(), ok()));
    assert!(exact.events.all().is_empty(), "{:?}", exact.events.all());

    // Without one control: that control is NOT_SUPPORTED (as if the driver lacked it) and
    // audited as denied by policy; the rest is unchanged.
    let mut fewer = names.clone();
    fewer.remove(PROBED_IDS_NAME);
    let mut minus = Session::new(&sim, only(&fewer));
    let (probed, attached) = minus.run();
    assert_eq!(
        probed,
        Answer {
            ret: Ok(0),
            status: Some(NV_ERR_NOT_SUPPORTED)
        }
    );
    assert_eq!(attached, ok());
    let ev = minus.events.all();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(
        (
            ev[0].kind,
            ev[0].name.as_str(),
            ev[0].decision,
            ev[0].reason,
            ev[0].nv_status
        ),
        (
            Kind::Control,
            PROBED_IDS_NAME,
            Decision::Denied,
            Some("policy"),
            Some(NV_ERR_NOT_SUPPORTED)
        )
    );

    // Without the control escape: every control fails as an unknown escape would (EINVAL).
    let mut fewer = names.clone();
    fewer.remove("NV_ESC_RM_CONTROL");
    let mut no_ctl = Session::new(&sim, only(&fewer));
    let (probed, attached) = no_ctl.run();
    let einval = Answer {
        ret: Err(libc::EINVAL),
        status: None,
    };
    assert_eq!((probed, attached), (einval.clone(), einval));
    assert!(
        no_ctl
            .events
            .all()
            .iter()
            .all(|e| e.name == "NV_ESC_RM_CONTROL" && e.decision == Decision::Denied)
    );
    assert_eq!((sim.live_clients(), sim.open_files()), (0, 0));
}

#[test]
fn test_only_in_audit_mode_lets_unlisted_entries_through_as_would_deny() {
    let sim = SimDriver::new(SimConfig::default_gpus(1));
    let mut policy = only(&BTreeSet::new());
    policy.mode = Mode::Audit;
    let mut s = Session::new(&sim, policy);
    assert_eq!(s.run(), (ok(), ok()));
    let ev = s.events.all();
    assert!(!ev.is_empty());
    assert!(
        ev.iter().all(|e| e.decision == Decision::AuditWouldDeny),
        "{ev:?}"
    );
    assert!(ev.iter().any(|e| e.name == PROBED_IDS_NAME));
}
