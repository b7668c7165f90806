//! The host's NUMA layout, from sysfs: which node a NIC sits on and which cores belong to a
//! node, so a rail group's reactor can be pinned next to its NICs.
use std::fs;
use std::path::Path;

/// The NUMA node of an RDMA device (`/sys/class/infiniband/<dev>/device/numa_node`), or of a
/// network interface (`/sys/class/net/<dev>/device/numa_node`). `None` when unknown or when the
/// kernel reports -1 (a host with one node).
pub fn device_numa_node(dev: &str) -> Option<usize> {
    if dev.is_empty() || dev.contains('/') || dev.contains("..") {
        return None;
    }
    ["infiniband", "net"].iter().find_map(|class| {
        let v = fs::read_to_string(format!("/sys/class/{class}/{dev}/device/numa_node")).ok()?;
        v.trim().parse::<i64>().ok().filter(|&n| n >= 0).map(|n| n as usize)
    })
}

/// Where the kernel's NUMA nodes are described.
const NODES: &str = "/sys/devices/system/node";

/// The NUMA nodes described under `root` (`node*`); `[0]` when it says nothing.
fn numa_nodes_at(root: &Path) -> Vec<usize> {
    let mut nodes: Vec<usize> = fs::read_dir(root)
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("node")?.parse().ok()).collect())
        .unwrap_or_default();
    nodes.sort_unstable();
    if nodes.is_empty() {
        nodes.push(0);
    }
    nodes
}

/// The cores of NUMA node `node` under `root` (its `cpulist`, e.g. `0-15,32-47`).
fn node_cpus_at(root: &Path, node: usize) -> Vec<usize> {
    fs::read_to_string(root.join(format!("node{node}/cpulist")))
        .map(|s| parse_cpulist(&s))
        .unwrap_or_default()
}

/// Parse a kernel cpulist (`0-3,8,10-11`).
pub fn parse_cpulist(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    out.extend(a..=b.min(a + 4096));
                }
            }
            None => out.extend(part.trim().parse::<usize>().ok()),
        }
    }
    out
}

/// Rails grouped by the NUMA node their NIC sits on (`rail_numa[r]`; unknown counts as node
/// 0): one reactor per group, pinned to a core of its node, keeps each NIC's completions on
/// the socket the NIC is attached to.
pub fn rail_groups(rail_numa: &[Option<usize>]) -> Vec<(usize, Vec<usize>)> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for (r, n) in rail_numa.iter().enumerate() {
        let n = n.unwrap_or(0);
        match groups.iter_mut().find(|(node, _)| *node == n) {
            Some((_, rails)) => rails.push(r),
            None => groups.push((n, vec![r])),
        }
    }
    groups
}

/// The core a reactor serving rails on `node` should take when none is configured: the last
/// core of the node not `taken` by another reactor (the first ones usually carry the OS and
/// the application's main threads). `None` on a single-node host, where any core is as near.
pub fn reactor_core_for(node: usize, taken: &[usize]) -> Option<usize> {
    reactor_core_at(Path::new(NODES), node, taken)
}

fn reactor_core_at(root: &Path, node: usize, taken: &[usize]) -> Option<usize> {
    if numa_nodes_at(root).len() < 2 {
        return None;
    }
    let cpus = node_cpus_at(root, node);
    cpus.iter().rev().find(|c| !taken.contains(c)).or(cpus.last()).copied()
}

/// Parse rail groups as `RDMALANE_RAIL_GROUPS` gives them: `0,1;2,3` (groups split by `;`,
/// rails by `,`). `None` when malformed.
pub fn parse_rail_groups(s: &str) -> Option<Vec<Vec<usize>>> {
    s.split(';')
        .map(|g| g.split(',').map(|r| r.trim().parse().ok()).collect::<Option<Vec<usize>>>())
        .collect()
}

/// Check that `groups` share out rails `0..rails`, each to one group, and put them in order:
/// rails ascending in each group, groups by their first rail (so the first holds rail 0).
pub fn check_rail_groups(mut groups: Vec<Vec<usize>>, rails: usize) -> Result<Vec<Vec<usize>>, String> {
    let mut seen = vec![false; rails];
    for g in &mut groups {
        if g.is_empty() {
            return Err("an empty rail group".into());
        }
        g.sort_unstable();
        for &r in g.iter() {
            match seen.get_mut(r) {
                None => return Err(format!("rail {r} in a rail group, of {rails} rails")),
                Some(true) => return Err(format!("rail {r} in two rail groups")),
                Some(s) => *s = true,
            }
        }
    }
    if let Some(r) = seen.iter().position(|s| !s) {
        return Err(format!("rail {r} is in no rail group"));
    }
    groups.sort_unstable_by_key(|g| g[0]);
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_parse() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(""), Vec::<usize>::new());
        assert_eq!(parse_cpulist("x,2"), vec![2]);
    }

    #[test]
    fn rails_group_by_node() {
        let g = rail_groups(&[Some(0), Some(1), Some(0), None, Some(1)]);
        assert_eq!(g, vec![(0, vec![0, 2, 3]), (1, vec![1, 4])]);
    }

    #[test]
    fn rail_groups_parse_and_check() {
        assert_eq!(parse_rail_groups("2,3;0, 1"), Some(vec![vec![2, 3], vec![0, 1]]));
        assert_eq!(parse_rail_groups("0;x"), None);
        assert_eq!(check_rail_groups(vec![vec![3, 2], vec![1, 0]], 4), Ok(vec![vec![0, 1], vec![2, 3]]));
        assert!(check_rail_groups(vec![vec![0], vec![0, 1]], 2).unwrap_err().contains("two"));
        assert!(check_rail_groups(vec![vec![0]], 2).unwrap_err().contains("rail 1 is in no"));
        assert!(check_rail_groups(vec![vec![0, 5]], 2).unwrap_err().contains("rail 5"));
        assert!(check_rail_groups(vec![vec![0, 1], vec![]], 2).unwrap_err().contains("empty"));
    }

    /// A two-socket host as sysfs describes it, in a scratch directory.
    fn two_nodes() -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!("rdmalane-topology-{}", std::process::id()));
        for (n, cpus) in [(0, "0-3,8-11\n"), (1, "4-7,12-15\n")] {
            fs::create_dir_all(root.join(format!("node{n}"))).unwrap();
            fs::write(root.join(format!("node{n}/cpulist")), cpus).unwrap();
        }
        root
    }

    #[test]
    fn each_nodes_reactors_take_its_last_free_cores() {
        let root = two_nodes();
        assert_eq!(numa_nodes_at(&root), vec![0, 1]);
        // Rails on nodes 1, 0, 1 and 1: two groups, by node.
        let groups = rail_groups(&[Some(1), Some(0), Some(1), Some(1)]);
        assert_eq!(groups, vec![(1, vec![0, 2, 3]), (0, vec![1])]);
        let mut taken = Vec::new();
        for (node, _) in &groups {
            taken.extend(reactor_core_at(&root, *node, &taken));
        }
        assert_eq!(taken, vec![15, 11], "each group's reactor on its own node");
        // Two groups on one node (set by hand) take different cores.
        assert_eq!(reactor_core_at(&root, 1, &[15]), Some(14));
        // One node: any core is as near, none is chosen.
        let one = root.join("one");
        fs::create_dir_all(one.join("node0")).unwrap();
        assert_eq!(reactor_core_at(&one, 0, &[]), None);
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn this_host_has_a_node_and_cores() {
        let nodes = numa_nodes_at(Path::new(NODES));
        assert!(!nodes.is_empty());
        assert_eq!(device_numa_node("../../etc"), None);
    }
}
