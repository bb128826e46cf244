//! What this node offers: NVIDIA GPUs (as nvidia-smi lists them) and CPU slots.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::process::Command;

use ringtrain_core::spec::DeviceKind;
use ringtrain_protocol::RegisterDevice;

/// Which GPUs to offer: `all` (every GPU nvidia-smi lists; none when it is missing), `none`, or indices.
pub fn parse_gpus(text: &str) -> Result<Option<Vec<u32>>, String> {
    match text {
        "all" => Ok(None),
        "none" => Ok(Some(Vec::new())),
        list => list
            .split(',')
            .map(|i| {
                i.trim().parse::<u32>().map_err(|_| format!("{i:?} is not a GPU index (use all, none or 0,1,...)"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
    }
}

/// GPUs as `nvidia-smi` lists them (index, name, memory), filtered to `wanted`; empty without nvidia-smi.
pub fn gpus(wanted: Option<&[u32]>) -> Vec<RegisterDevice> {
    let output = Command::new("nvidia-smi")
        .args(["--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"])
        .output();
    let Some(output) = output.ok().filter(|o| o.status.success()) else { return Vec::new() };
    parse_nvidia_smi(&String::from_utf8_lossy(&output.stdout))
        .into_iter()
        .filter(|d| wanted.is_none_or(|w| w.contains(&d.index)))
        .collect()
}

/// `0, NVIDIA H200, 143771` per line (memory in MiB).
pub fn parse_nvidia_smi(text: &str) -> Vec<RegisterDevice> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(',').map(str::trim);
            let index = fields.next()?.parse().ok()?;
            let name = fields.next()?.to_string();
            let memory_bytes = fields.next().and_then(|m| m.parse::<u64>().ok()).map(|mib| mib << 20);
            Some(RegisterDevice { index, kind: DeviceKind::Gpu.to_string(), name, memory_bytes })
        })
        .collect()
}

/// What a rank process needs besides what a job's memory estimate counts (`ringtrain_core::memory`):
/// libtorch's runtime, the allocator's slack, convolution workspaces and the optimizer's temporaries.
/// Measured on this project's machines (CPU slots, `--slot-memory-mib`, peak resident memory against the
/// estimate): ResNet-20 at a batch of 32, 182 MiB resident for a 20 MiB estimate; ResNet-50 on 16×16
/// images at 32, 665 MiB for 300 MiB unsplit and 493 MiB for the 181 MiB of its larger pipeline stage.
pub const RANK_RUNTIME_BYTES: u64 = 320 << 20;

/// The memory of each rank of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankMemory {
    /// What a CPU slot registers: the server admits a job whose per-rank estimate fits it.
    pub slot: Option<u64>,
    /// The limit of each rank's cgroup: the slot and [`RANK_RUNTIME_BYTES`] for what estimates leave out.
    pub limit: Option<u64>,
}

/// Each rank's memory on this node: the operator's `--slot-memory-mib` (each rank's cgroup then allows
/// that and the runtime, and the operator sees that the slots fit the machine), else this machine's memory
/// shared among the `devices` it offers (of which a slot registers what is left after the runtime). On a
/// node that offers GPUs the cgroups keep the machine's share: a GPU rank's host memory (the CUDA runtime,
/// pinned buffers) is not a CPU slot's.
pub fn rank_memory(mib: Option<u64>, devices: u64, offers_gpus: bool) -> RankMemory {
    let share = memory_total().map(|total| total / devices.max(1));
    match mib {
        Some(mib) if !offers_gpus => {
            RankMemory { slot: Some(mib << 20), limit: Some((mib << 20) + RANK_RUNTIME_BYTES) }
        }
        Some(mib) => RankMemory { slot: Some(mib << 20), limit: share },
        None => RankMemory { slot: share.map(|s| s.saturating_sub(RANK_RUNTIME_BYTES).max(s / 2)), limit: share },
    }
}

/// `count` CPU slots, each one rank's worth of this machine with `share` of its memory, which the
/// server checks a job's memory estimate against.
pub fn cpu_slots(count: u32, share: Option<u64>) -> Vec<RegisterDevice> {
    (0..count)
        .map(|index| RegisterDevice {
            index,
            kind: DeviceKind::Cpu.to_string(),
            name: format!("cpu slot {index}"),
            memory_bytes: share,
        })
        .collect()
}

/// This machine's memory (`MemTotal` of /proc/meminfo), in bytes.
pub fn memory_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total(&info)
}

fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

pub fn cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// The address other nodes reach this one at: the local address of the route to the server (a UDP
/// "connect" sends nothing); loopback when the server is local or the route is unknown.
pub fn address_towards(server: &str) -> IpAddr {
    let host_port = server.split("://").nth(1).unwrap_or(server).split('/').next().unwrap_or("");
    let socket = UdpSocket::bind("0.0.0.0:0").ok();
    socket
        .and_then(|s| {
            let target = if host_port.contains(':') { host_port.to_string() } else { format!("{host_port}:80") };
            s.connect(target).ok()?;
            s.local_addr().ok()
        })
        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |a| a.ip())
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_lines_become_devices() {
        let devices = parse_nvidia_smi("0, NVIDIA H200, 143771\n1, NVIDIA H200, 143771\n");
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[1].index, 1);
        assert_eq!(devices[0].name, "NVIDIA H200");
        assert_eq!(devices[0].memory_bytes, Some(143_771 << 20));
        assert_eq!(parse_mem_total("MemTotal:       24551264 kB\nMemFree: 1 kB\n"), Some(24_551_264 * 1024));
        assert_eq!(parse_mem_total("nothing"), None);
        let shared = rank_memory(None, 2, false);
        let slots = cpu_slots(2, shared.slot);
        assert_eq!(slots[0].memory_bytes, slots[1].memory_bytes);
        assert!(slots[0].memory_bytes.unwrap() > 0);
        assert!(shared.limit.unwrap() * 2 <= memory_total().unwrap(), "the ranks' limits fit the machine");
        assert!(shared.slot.unwrap() < shared.limit.unwrap(), "a slot leaves room for the runtime");
        let set = rank_memory(Some(640), 2, false);
        assert_eq!(cpu_slots(1, set.slot)[0].memory_bytes, Some(640 << 20));
        assert_eq!(set.limit, Some((640 << 20) + RANK_RUNTIME_BYTES));
        assert_eq!(rank_memory(Some(640), 2, true).limit, shared.limit, "GPU ranks keep the machine's share");
    }

    #[test]
    fn gpu_lists_parse_or_name_the_bad_entry() {
        assert_eq!(parse_gpus("all"), Ok(None));
        assert_eq!(parse_gpus("none"), Ok(Some(vec![])));
        assert_eq!(parse_gpus("0,2"), Ok(Some(vec![0, 2])));
        assert!(parse_gpus("0,x").unwrap_err().contains("\"x\""));
    }

    #[test]
    fn a_local_server_is_reached_over_loopback() {
        assert_eq!(address_towards("http://127.0.0.1:8080"), IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
}
