//! The nodes of the job as the world sees them, and the ranks each point's node fill
//! takes from them.

use anyhow::{ensure, Result};

use super::spec::NodeFill;

/// The nodes of the job as the world sees them: each node's world ranks, in rank order;
/// nodes in the order of their lowest rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub nodes: Vec<Vec<usize>>,
    pub hosts: Vec<String>,
}

impl Layout {
    /// From every world rank's host name.
    pub(crate) fn from_hosts(hosts: &[String]) -> Layout {
        let mut names: Vec<String> = Vec::new();
        let mut nodes: Vec<Vec<usize>> = Vec::new();
        for (rank, h) in hosts.iter().enumerate() {
            match names.iter().position(|n| n == h) {
                Some(i) => nodes[i].push(rank),
                None => {
                    names.push(h.clone());
                    nodes.push(vec![rank]);
                }
            }
        }
        Layout { nodes, hosts: names }
    }

    pub(crate) fn world_size(&self) -> usize {
        self.nodes.iter().map(Vec::len).sum()
    }

    /// Ranks on the smallest node: what a full node holds in the ladder.
    pub(crate) fn ranks_per_node(&self) -> usize {
        self.nodes.iter().map(Vec::len).min().unwrap_or(1)
    }

    /// The default ladder: 1, then doubling within the first node until it is full, then
    /// doubling the number of full nodes: 1, 2, 4 | 8, 16 on 4-rank nodes.
    pub(crate) fn default_ladder(&self) -> Vec<usize> {
        let per = self.ranks_per_node().max(1);
        let mut ladder = Vec::new();
        let mut k = 1;
        while k < per {
            ladder.push(k);
            k *= 2;
        }
        ladder.push(per);
        let mut nodes = 2;
        while nodes < self.nodes.len() {
            ladder.push(nodes * per);
            nodes *= 2;
        }
        if self.nodes.len() > 1 {
            ladder.push(self.nodes.len() * per);
        }
        ladder.dedup();
        ladder
    }

    /// The world ranks of a `k`-rank point.
    pub(crate) fn ranks_for(&self, k: usize, fill: NodeFill) -> Result<Vec<usize>> {
        let per = self.ranks_per_node().max(1);
        ensure!(
            k >= 1 && k <= self.world_size(),
            "a {k}-rank point needs {k} ranks, and the job has {} (launch the study with the most ranks any point uses)",
            self.world_size()
        );
        let mut out = Vec::with_capacity(k);
        match fill {
            NodeFill::Pack => {
                ensure!(
                    k <= per * self.nodes.len(),
                    "a {k}-rank point does not fit {} nodes of {per} ranks",
                    self.nodes.len()
                );
                for node in &self.nodes {
                    out.extend(node.iter().take(per.min(k - out.len())));
                    if out.len() == k {
                        break;
                    }
                }
            }
            NodeFill::Spread => {
                let mut round = 0;
                while out.len() < k {
                    for node in &self.nodes {
                        if let Some(&r) = node.get(round) {
                            if out.len() < k {
                                out.push(r);
                            }
                        }
                    }
                    round += 1;
                }
                out.sort_unstable();
            }
        }
        Ok(out)
    }

    /// Why a study of `ladder` with `fill` would not measure what it says: `spread` puts
    /// each rank of a point on a node of its own, so a point of more ranks than the
    /// allocation has nodes puts some of them on one node, and a study about nodes would
    /// conclude from links it did not cross (on one node, every point of 2 ranks or more
    /// is an intra-node run).
    pub(crate) fn node_fill_concern(&self, ladder: &[usize], fill: NodeFill) -> Option<String> {
        if fill != NodeFill::Spread {
            return None;
        }
        let nodes = self.nodes.len().max(1);
        let mut over: Vec<usize> = ladder.iter().copied().filter(|&k| k > nodes).collect();
        over.sort_unstable();
        over.dedup();
        let (&first, &widest) = (over.first()?, over.last()?);
        let others = match &over[1..] {
            [] => String::new(),
            rest => format!(", as would its points of {} ranks", and_list(rest)),
        };
        let fewer = if nodes > 1 {
            format!(", keep every point within {nodes} ranks (study key `ranks`, study --ranks)")
        } else {
            String::new()
        };
        let allocation = if nodes == 1 {
            "1 node".to_string()
        } else {
            format!("{nodes} nodes")
        };
        Some(format!(
            "node_fill = \"spread\" puts each rank of a point on a node of its own, but the allocation has {allocation} ({}, \
             {} rank(s)): its {first}-rank point needs {first} nodes and would put {} of its ranks on one node{others}; \
             submit on as many nodes as the widest point has ranks (sbatch -N {widest}, mpirun --host <one per node>)\
             {fewer}, or use node_fill = \"pack\"",
            host_list(&self.hosts),
            self.world_size(),
            first.div_ceil(nodes),
        ))
    }

    /// The most ranks `members` put on one node.
    pub(crate) fn most_on_a_node(&self, members: &[usize]) -> usize {
        self.nodes
            .iter()
            .map(|n| n.iter().filter(|r| members.contains(r)).count())
            .max()
            .unwrap_or(0)
    }
}

/// `2`, `2 and 4`, `2, 4 and 8`.
fn and_list(counts: &[usize]) -> String {
    let words: Vec<String> = counts.iter().map(usize::to_string).collect();
    match words.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => words.join(""),
    }
}

/// The allocation's host names for a message: the first four, then how many more.
fn host_list(hosts: &[String]) -> String {
    const SHOWN: usize = 4;
    match hosts.len() {
        0 => "?".into(),
        n if n <= SHOWN => hosts.join(", "),
        n => format!("{}, and {} more", hosts[..SHOWN].join(", "), n - SHOWN),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn hosts(nodes: usize, per: usize) -> Layout {
        let h: Vec<String> = (0..nodes * per).map(|r| format!("n{}", r / per)).collect();
        Layout::from_hosts(&h)
    }

    #[test]
    fn the_default_ladder_fills_a_node_then_doubles_nodes() {
        assert_eq!(hosts(2, 4).default_ladder(), vec![1, 2, 4, 8]);
        assert_eq!(hosts(16, 4).default_ladder(), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(hosts(3, 4).default_ladder(), vec![1, 2, 4, 8, 12]);
        assert_eq!(hosts(1, 2).default_ladder(), vec![1, 2]);
        assert_eq!(hosts(1, 1).default_ladder(), vec![1]);
        assert_eq!(hosts(1, 6).default_ladder(), vec![1, 2, 4, 6]);
    }

    #[test]
    fn spread_on_one_node_is_named_with_the_allocation() {
        let one = Layout::from_hosts(&["a".to_string(), "a".to_string()]);
        let c = one.node_fill_concern(&[1, 2], NodeFill::Spread).unwrap();
        assert!(
            c.contains("the allocation has 1 node (a, 2 rank(s))") && c.contains("sbatch -N 2"),
            "{c}"
        );
        assert!(one.node_fill_concern(&[1, 2], NodeFill::Pack).is_none());
        assert!(
            one.node_fill_concern(&[1], NodeFill::Spread).is_none(),
            "one rank spans one node anyway"
        );
        let two = Layout::from_hosts(&["a".to_string(), "b".to_string()]);
        assert!(two.node_fill_concern(&[1, 2], NodeFill::Spread).is_none());
    }

    /// A spread point of more ranks than the allocation has nodes puts two of them on one
    /// node: named with its ranks, the nodes it needs, the allocation and the fixes.
    #[test]
    fn a_spread_point_wider_than_the_allocation_is_named_with_the_nodes_it_needs() {
        let l = hosts(2, 4);
        assert!(l.node_fill_concern(&[1, 2], NodeFill::Spread).is_none(), "one rank per node");
        assert!(l.node_fill_concern(&[1, 2, 4, 8], NodeFill::Pack).is_none());
        let c = l.node_fill_concern(&[8, 1, 2, 4], NodeFill::Spread).unwrap();
        for part in [
            "the allocation has 2 nodes (n0, n1, 8 rank(s))",
            "its 4-rank point needs 4 nodes and would put 2 of its ranks on one node",
            "as would its points of 8 ranks",
            "sbatch -N 8",
            "keep every point within 2 ranks",
            "node_fill = \"pack\"",
        ] {
            assert!(c.contains(part), "{part}: {c}");
        }
        let c = hosts(6, 2).node_fill_concern(&[1, 2, 4, 8, 12], NodeFill::Spread).unwrap();
        assert!(
            c.contains("6 nodes (n0, n1, n2, n3, and 2 more, 12 rank(s)): its 8-rank point needs 8 nodes")
                && c.contains("as would its points of 12 ranks;"),
            "{c}"
        );
    }

    #[test]
    fn pack_fills_nodes_and_spread_crosses_them_first() {
        let l = hosts(2, 4);
        assert_eq!(l.ranks_for(4, NodeFill::Pack).unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(l.ranks_for(6, NodeFill::Pack).unwrap(), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(l.ranks_for(2, NodeFill::Spread).unwrap(), vec![0, 4]);
        assert_eq!(l.ranks_for(4, NodeFill::Spread).unwrap(), vec![0, 1, 4, 5]);
        assert_eq!(l.most_on_a_node(&[0, 1, 4, 5]), 2);
        let e = l.ranks_for(9, NodeFill::Pack).unwrap_err().to_string();
        assert!(e.contains("the job has 8"), "{e}");
        // Ranks interleaved over hosts (round-robin mapping) are grouped by host.
        let l = Layout::from_hosts(&["a".into(), "b".into(), "a".into(), "b".into()]);
        assert_eq!(l.nodes, vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(l.ranks_for(2, NodeFill::Pack).unwrap(), vec![0, 2]);
    }
}
