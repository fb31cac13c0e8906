//! PCI bus ids and the cores nearest a PCI device (a GPU), from libhwloc.
//!
//! The hwloc2 crate cannot see I/O objects (it has no I/O type filter and no PCI
//! attributes, and asking it for PCI or OS devices panics), so this module
//! loads a topology of its own through a handful of FFI calls into the same
//! libhwloc (2.x): I/O objects kept, the PCI level walked by depth, then up the
//! `parent` links to the first ancestor with a cpuset, which is where hwloc
//! attaches the device. Every `unsafe` block of this walk lives here.
//!
//! The `struct hwloc_obj` and `struct hwloc_pcidev_attr_s` mirrors below copy
//! hwloc 2.9's `hwloc.h` field for field; hwloc keeps that ABI within a major
//! version, which [`Hwloc::load`] checks. `tests::layout_matches_c_header`
//! compares every offset with the C compiler's, and [`Hwloc::pci_devices`]
//! checks each object's type and depth so a mismatch fails with an error, not
//! garbage.

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde::Serialize;
use std::ffi::{c_char, c_int, c_uchar, c_uint, c_ushort, c_void};
use std::fmt;
use std::str::FromStr;

/// A PCI address: domain, bus, device, function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub(crate) struct PciBusId {
    /// PCI domain (segment). NVML reports 32 bits; hwloc supports 16.
    pub domain: u32,
    pub bus: u8,
    /// Device on the bus, 0-31.
    pub device: u8,
    /// Function of the device, 0-7.
    pub function: u8,
}

impl fmt::Display for PciBusId {
    /// The canonical sysfs form, lowercase with a 4-digit domain: `0000:3b:00.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

impl FromStr for PciBusId {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<PciBusId> {
        parse_pci_bus_id(s)
    }
}

/// Parses a PCI bus id as sysfs (`0000:3b:00.0`), NVML and CUDA (`00000000:3B:00.0`)
/// or lspci without domain (`3b:00.0`, domain 0) write it; hex digits in either case.
pub(crate) fn parse_pci_bus_id(s: &str) -> Result<PciBusId> {
    let t = s.trim();
    let bad = |why: &str| anyhow!("{s:?} is not a PCI bus id ({why}); expected DOMAIN:BUS:DEVICE.FUNCTION in hex, e.g. 0000:3b:00.0");
    let hex = |part: &str, max_digits: usize, what: &str| -> Result<u32> {
        if part.is_empty() || part.len() > max_digits || !part.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad(&format!("{what} {part:?} is not 1-{max_digits} hex digits")));
        }
        Ok(u32::from_str_radix(part, 16).expect("checked hex digits"))
    };
    let parts: Vec<&str> = t.split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [domain, bus, rest] => (hex(domain, 8, "domain")?, *bus, *rest),
        [bus, rest] => (0, *bus, *rest),
        _ => return Err(bad("wrong number of ':'")),
    };
    let bus = hex(bus, 2, "bus")?;
    let (device, function) = rest.split_once('.').ok_or_else(|| bad("no '.' before the function"))?;
    let device = hex(device, 2, "device")?;
    let function = hex(function, 1, "function")?;
    if device > 0x1f {
        return Err(bad("device is above 1f"));
    }
    if function > 7 {
        return Err(bad("function is above 7"));
    }
    Ok(PciBusId {
        domain,
        bus: bus as u8,
        device: device as u8,
        function: function as u8,
    })
}

/// Where a PCI device (a GPU) attaches: the hardware nearest to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct GpuPlace {
    /// Canonical bus id, e.g. `0000:3b:00.0`.
    pub bus_id: String,
    /// OS indexes of the hardware threads (PUs) of the cores nearest the device.
    pub pus: Vec<u32>,
    /// Packages those PUs sit in (hwloc logical indexes, as [`super::CoreSlot::package`]).
    pub packages: Vec<usize>,
    /// NUMA nodes local to the device (OS indexes, as `numactl` and sysfs number them).
    pub numa_nodes: Vec<usize>,
}

/// The cores, packages and NUMA nodes nearest the PCI device `bus_id`.
///
/// Loads a fresh hwloc topology with I/O objects (a few ms to tens of ms), so call
/// it once per device, not per step. Fails with a message naming the bus id when
/// hwloc has no such device.
pub(crate) fn pci_locality(bus_id: &PciBusId) -> Result<GpuPlace> {
    let domain = u16::try_from(bus_id.domain).map_err(|_| {
        anyhow!("PCI device {bus_id}: its domain is above ffff, which libhwloc (built with 16-bit PCI domains) cannot name")
    })?;
    let hw = Hwloc::load()?;
    let devices = hw.pci_devices()?;
    let want = (domain, bus_id.bus, bus_id.device, bus_id.function);
    let obj = devices.iter().find(|(id, _)| *id == want).map(|(_, o)| *o).ok_or_else(|| {
        anyhow!(
            "PCI device {bus_id} not found in hwloc's PCI tree ({} device(s) there); check the id with `lspci -D` or \
             `nvidia-smi --query-gpu=pci.bus_id --format=csv`",
            devices.len()
        )
    })?;
    let anchor = hw
        .first_ancestor_with_cpuset(obj)
        .ok_or_else(|| anyhow!("PCI device {bus_id}: hwloc gives none of its ancestors a cpuset"))?;
    let pus = Hwloc::bitmap_ids(anchor.cpuset).with_context(|| format!("PCI device {bus_id}: cpuset"))?;
    let numa_nodes = if anchor.nodeset.is_null() {
        Vec::new()
    } else {
        Hwloc::bitmap_ids(anchor.nodeset).with_context(|| format!("PCI device {bus_id}: nodeset"))?
    };
    let packages = hw.packages_intersecting(anchor.cpuset)?;
    Ok(GpuPlace {
        bus_id: bus_id.to_string(),
        pus,
        packages,
        numa_nodes: numa_nodes.into_iter().map(|n| n as usize).collect(),
    })
}

/// Mirrors of hwloc 2.x's C declarations (`/usr/include/hwloc.h`), only what the walk reads.
mod ffi {
    use super::*;

    /// `hwloc_obj_type_t` values used here (hwloc.h, enum order).
    pub(super) const HWLOC_OBJ_PACKAGE: c_int = 1;
    pub(super) const HWLOC_OBJ_PCI_DEVICE: c_int = 15;
    /// `HWLOC_TYPE_DEPTH_UNKNOWN` and `_MULTIPLE`: no such level / several levels.
    pub(super) const HWLOC_TYPE_DEPTH_UNKNOWN: c_int = -1;
    pub(super) const HWLOC_TYPE_DEPTH_MULTIPLE: c_int = -2;
    /// `enum hwloc_type_filter_e`.
    pub(super) const HWLOC_TYPE_FILTER_KEEP_ALL: c_int = 0;
    /// `HWLOC_API_VERSION` of the 2.9 header this mirror was written from.
    pub(super) const HWLOC_API_VERSION: c_uint = 0x0002_0800;

    /// `struct hwloc_obj` (hwloc 2.x), every field in order so the offsets match.
    #[repr(C)]
    pub(super) struct HwlocObj {
        pub type_: c_int,
        pub subtype: *mut c_char,
        pub os_index: c_uint,
        pub name: *mut c_char,
        pub total_memory: u64,
        /// `union hwloc_obj_attr_u *`; for PCI devices its `pcidev` member.
        pub attr: *mut PcidevAttr,
        pub depth: c_int,
        pub logical_index: c_uint,
        pub next_cousin: *mut HwlocObj,
        pub prev_cousin: *mut HwlocObj,
        pub parent: *mut HwlocObj,
        pub sibling_rank: c_uint,
        pub next_sibling: *mut HwlocObj,
        pub prev_sibling: *mut HwlocObj,
        pub arity: c_uint,
        pub children: *mut *mut HwlocObj,
        pub first_child: *mut HwlocObj,
        pub last_child: *mut HwlocObj,
        pub symmetric_subtree: c_int,
        pub memory_arity: c_uint,
        pub memory_first_child: *mut HwlocObj,
        pub io_arity: c_uint,
        pub io_first_child: *mut HwlocObj,
        pub misc_arity: c_uint,
        pub misc_first_child: *mut HwlocObj,
        /// `hwloc_cpuset_t`; NULL for I/O objects.
        pub cpuset: *mut c_void,
        pub complete_cpuset: *mut c_void,
        pub nodeset: *mut c_void,
        pub complete_nodeset: *mut c_void,
        pub infos: *mut c_void,
        pub infos_count: c_uint,
        pub userdata: *mut c_void,
        pub gp_index: u64,
    }

    /// `struct hwloc_pcidev_attr_s` without `HWLOC_HAVE_32BITS_PCI_DOMAIN` (Debian's build).
    #[repr(C)]
    pub(super) struct PcidevAttr {
        pub domain: c_ushort,
        pub bus: c_uchar,
        pub dev: c_uchar,
        pub func: c_uchar,
        pub class_id: c_ushort,
        pub vendor_id: c_ushort,
        pub device_id: c_ushort,
        pub subvendor_id: c_ushort,
        pub subdevice_id: c_ushort,
        pub revision: c_uchar,
        pub linkspeed: f32,
    }

    #[link(name = "hwloc")]
    extern "C" {
        pub(super) fn hwloc_get_api_version() -> c_uint;
        pub(super) fn hwloc_topology_init(topologyp: *mut *mut c_void) -> c_int;
        pub(super) fn hwloc_topology_set_io_types_filter(topology: *mut c_void, filter: c_int) -> c_int;
        pub(super) fn hwloc_topology_load(topology: *mut c_void) -> c_int;
        pub(super) fn hwloc_topology_destroy(topology: *mut c_void);
        pub(super) fn hwloc_get_type_depth(topology: *mut c_void, type_: c_int) -> c_int;
        pub(super) fn hwloc_get_nbobjs_by_depth(topology: *mut c_void, depth: c_int) -> c_uint;
        pub(super) fn hwloc_get_obj_by_depth(topology: *mut c_void, depth: c_int, idx: c_uint) -> *mut HwlocObj;
        pub(super) fn hwloc_bitmap_weight(bitmap: *const c_void) -> c_int;
        pub(super) fn hwloc_bitmap_first(bitmap: *const c_void) -> c_int;
        pub(super) fn hwloc_bitmap_next(bitmap: *const c_void, prev: c_int) -> c_int;
        pub(super) fn hwloc_bitmap_intersects(a: *const c_void, b: *const c_void) -> c_int;
    }
}

/// (domain, bus, device, function) as hwloc stores them.
type PciAddress = (u16, u8, u8, u8);

/// A loaded hwloc topology with all I/O objects; destroyed on drop.
struct Hwloc {
    topo: *mut c_void,
}

impl Drop for Hwloc {
    fn drop(&mut self) {
        // SAFETY: `topo` came from a successful hwloc_topology_init and is destroyed once,
        // here; no reference into it outlives `self` (all borrow `&self`).
        unsafe { ffi::hwloc_topology_destroy(self.topo) }
    }
}

impl Hwloc {
    /// Initialises and loads this machine's topology, keeping every I/O object.
    fn load() -> Result<Hwloc> {
        // SAFETY: a plain query with no arguments.
        let api = unsafe { ffi::hwloc_get_api_version() };
        ensure!(
            api >> 16 == ffi::HWLOC_API_VERSION >> 16,
            "libhwloc has API version {api:#x}; ddpbench's hwloc object layout is for {:#x} (hwloc 2.x). Install hwloc 2 (Debian: libhwloc15)",
            ffi::HWLOC_API_VERSION
        );
        let mut topo: *mut c_void = std::ptr::null_mut();
        // SAFETY: `topo` is a valid out-pointer; on success hwloc stores an owned topology in it.
        let rc = unsafe { ffi::hwloc_topology_init(&mut topo) };
        ensure!(rc == 0 && !topo.is_null(), "hwloc_topology_init failed ({rc})");
        let hw = Hwloc { topo };
        // SAFETY: `hw.topo` is initialised and not yet loaded, as both calls require.
        let rc = unsafe { ffi::hwloc_topology_set_io_types_filter(hw.topo, ffi::HWLOC_TYPE_FILTER_KEEP_ALL) };
        ensure!(rc == 0, "hwloc could not be told to keep I/O objects ({rc})");
        // SAFETY: as above; after this the topology is read-only for us.
        let rc = unsafe { ffi::hwloc_topology_load(hw.topo) };
        ensure!(rc == 0, "hwloc could not read this machine's topology ({rc})");
        Ok(hw)
    }

    /// The objects of one level (a real or virtual depth), in logical order.
    fn level(&self, depth: c_int) -> Vec<&ffi::HwlocObj> {
        // SAFETY: the topology is loaded; a depth with no level gives 0.
        let n = unsafe { ffi::hwloc_get_nbobjs_by_depth(self.topo, depth) };
        (0..n)
            // SAFETY: idx < n, so hwloc returns a pointer into the topology, valid until
            // hwloc_topology_destroy, i.e. for as long as `&self` (the references' lifetime).
            .filter_map(|i| unsafe { ffi::hwloc_get_obj_by_depth(self.topo, depth, i).as_ref() })
            .collect()
    }

    /// The depth of the level holding objects of `type_`, if there is exactly one.
    fn depth_of(&self, type_: c_int) -> Option<c_int> {
        // SAFETY: the topology is loaded; `type_` is a valid hwloc_obj_type_t value.
        let d = unsafe { ffi::hwloc_get_type_depth(self.topo, type_) };
        (d != ffi::HWLOC_TYPE_DEPTH_UNKNOWN && d != ffi::HWLOC_TYPE_DEPTH_MULTIPLE).then_some(d)
    }

    /// Every PCI device with its address.
    fn pci_devices(&self) -> Result<Vec<(PciAddress, &ffi::HwlocObj)>> {
        let Some(depth) = self.depth_of(ffi::HWLOC_OBJ_PCI_DEVICE) else {
            bail!("hwloc sees no PCI devices on this machine (no /sys/bus/pci, or libhwloc built without PCI support)")
        };
        let mut out = Vec::new();
        for (i, obj) in self.level(depth).into_iter().enumerate() {
            // A wrong struct mirror would show here first: check what hwloc promised.
            ensure!(
                obj.type_ == ffi::HWLOC_OBJ_PCI_DEVICE && obj.depth == depth && obj.logical_index as usize == i && !obj.attr.is_null(),
                "libhwloc's object layout differs from the hwloc 2.x one ddpbench mirrors (PCI object {i}: type {}, depth {}); \
                 GPU locality is unavailable",
                obj.type_,
                obj.depth
            );
            // SAFETY: non-NULL (checked); for a PCI device hwloc's attr union holds `pcidev`,
            // which PcidevAttr mirrors, and it lives as long as the object.
            let a = unsafe { &*obj.attr };
            out.push(((a.domain, a.bus, a.dev, a.func), obj));
        }
        Ok(out)
    }

    /// The first of `obj`'s ancestors (or `obj` itself) that has a cpuset.
    fn first_ancestor_with_cpuset<'a>(&'a self, obj: &'a ffi::HwlocObj) -> Option<&'a ffi::HwlocObj> {
        let mut cur = Some(obj);
        while let Some(o) = cur {
            if !o.cpuset.is_null() {
                return Some(o);
            }
            // SAFETY: `parent` is NULL (root) or points to an object of the same topology.
            cur = unsafe { o.parent.as_ref() };
        }
        None
    }

    /// Logical indexes of the packages whose cpusets intersect `cpuset`.
    fn packages_intersecting(&self, cpuset: *const c_void) -> Result<Vec<usize>> {
        let Some(depth) = self.depth_of(ffi::HWLOC_OBJ_PACKAGE) else {
            return Ok(Vec::new());
        };
        Ok(self
            .level(depth)
            .into_iter()
            // SAFETY: both are valid bitmaps of this topology (a package always has a cpuset).
            .filter(|p| !p.cpuset.is_null() && unsafe { ffi::hwloc_bitmap_intersects(p.cpuset, cpuset) } == 1)
            .map(|p| p.logical_index as usize)
            .collect())
    }

    /// The indexes set in a finite hwloc bitmap, ascending.
    fn bitmap_ids(bitmap: *const c_void) -> Result<Vec<u32>> {
        ensure!(!bitmap.is_null(), "no bitmap");
        // SAFETY: a valid, non-NULL bitmap owned by the live topology.
        let weight = unsafe { ffi::hwloc_bitmap_weight(bitmap) };
        ensure!(weight >= 0, "the bitmap is infinite");
        let mut ids = Vec::with_capacity(weight as usize);
        // SAFETY: as above; first/next return -1 past the last set bit.
        let mut i = unsafe { ffi::hwloc_bitmap_first(bitmap) };
        while i >= 0 && ids.len() < weight as usize {
            ids.push(i as u32);
            // SAFETY: as above.
            i = unsafe { ffi::hwloc_bitmap_next(bitmap, i) };
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::mem::{offset_of, size_of};

    #[test]
    fn parses_sysfs_nvml_and_short_forms() {
        let want = PciBusId {
            domain: 0,
            bus: 0x3b,
            device: 0,
            function: 0,
        };
        for s in ["0000:3b:00.0", "00000000:3B:00.0", "3b:00.0", " 0000:3B:00.0\n"] {
            assert_eq!(parse_pci_bus_id(s).unwrap(), want, "{s:?}");
        }
        let id = parse_pci_bus_id("0001:AF:1f.7").unwrap();
        assert_eq!((id.domain, id.bus, id.device, id.function), (1, 0xaf, 0x1f, 7));
        assert_eq!(id.to_string(), "0001:af:1f.7");
        assert_eq!(parse_pci_bus_id("00000000:3B:00.0").unwrap().to_string(), "0000:3b:00.0");
        assert_eq!("3b:00.0".parse::<PciBusId>().unwrap().to_string(), "0000:3b:00.0");
    }

    #[test]
    fn rejects_malformed_ids_with_a_reason() {
        for (s, why) in [
            ("", "wrong number"),
            ("3b", "wrong number"),
            ("0:0:0:00.0", "wrong number"),
            ("0000:3b:00", "no '.'"),
            ("0000:3g:00.0", "bus"),
            ("0000:3b:20.0", "above 1f"),
            ("0000:3b:00.8", "above 7"),
            ("000000000:3b:00.0", "domain"),
            ("0000:3b:00.", "function"),
        ] {
            let e = parse_pci_bus_id(s).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("not a PCI bus id"), "{s:?}: {e}");
        }
    }

    /// Offsets and sizes of the mirrored C structs as Rust lays them out.
    fn rust_layout() -> Vec<(&'static str, usize)> {
        use ffi::{HwlocObj as O, PcidevAttr as P};
        vec![
            ("sizeof_obj", size_of::<O>()),
            ("type", offset_of!(O, type_)),
            ("os_index", offset_of!(O, os_index)),
            ("attr", offset_of!(O, attr)),
            ("depth", offset_of!(O, depth)),
            ("logical_index", offset_of!(O, logical_index)),
            ("parent", offset_of!(O, parent)),
            ("io_first_child", offset_of!(O, io_first_child)),
            ("cpuset", offset_of!(O, cpuset)),
            ("nodeset", offset_of!(O, nodeset)),
            ("gp_index", offset_of!(O, gp_index)),
            ("sizeof_pcidev", size_of::<P>()),
            ("domain", offset_of!(P, domain)),
            ("bus", offset_of!(P, bus)),
            ("dev", offset_of!(P, dev)),
            ("func", offset_of!(P, func)),
            ("class_id", offset_of!(P, class_id)),
            ("revision", offset_of!(P, revision)),
            ("linkspeed", offset_of!(P, linkspeed)),
        ]
    }

    /// The mirror against hwloc 2.9's header as measured on x86_64 (`offsetof` in C).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn layout_matches_hwloc_2_9_on_64_bit() {
        let c = [
            248, 0, 16, 40, 48, 52, 72, 160, 184, 200, 240, // struct hwloc_obj
            24, 0, 2, 3, 4, 6, 16, 20, // struct hwloc_pcidev_attr_s
        ];
        let rust = rust_layout();
        for ((name, got), want) in rust.iter().zip(c) {
            assert_eq!(*got, want, "{name}");
        }
    }

    /// The mirror against the installed header, compiled by the C compiler; skipped
    /// (with a note) where there is no `cc` or no hwloc.h.
    #[test]
    fn layout_matches_c_header() {
        let header = std::path::Path::new("/usr/include/hwloc.h");
        if !header.exists() {
            eprintln!("skipped: no {}", header.display());
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let fields = rust_layout();
        let mut src = String::from("#include <hwloc.h>\n#include <stdio.h>\n#include <stddef.h>\nint main(void) {\n");
        for (name, _) in &fields {
            let expr = match *name {
                "sizeof_obj" => "sizeof(struct hwloc_obj)".to_string(),
                "sizeof_pcidev" => "sizeof(struct hwloc_pcidev_attr_s)".to_string(),
                "domain" | "bus" | "dev" | "func" | "class_id" | "revision" | "linkspeed" => {
                    format!("offsetof(struct hwloc_pcidev_attr_s, {name})")
                }
                _ => format!("offsetof(struct hwloc_obj, {name})"),
            };
            src.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
        }
        src.push_str("  printf(\"%u\\n\", (unsigned)HWLOC_API_VERSION);\n  printf(\"%d %d %d\\n\", HWLOC_OBJ_PACKAGE, HWLOC_OBJ_PCI_DEVICE, HWLOC_TYPE_FILTER_KEEP_ALL);\n  return 0;\n}\n");
        let c_file = dir.path().join("layout.c");
        let exe = dir.path().join("layout");
        std::fs::write(&c_file, src).unwrap();
        let out = match std::process::Command::new("cc").arg(&c_file).arg("-o").arg(&exe).output() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("skipped: no C compiler ({e})");
                return;
            }
        };
        assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
        let run = std::process::Command::new(&exe).output().unwrap();
        let text = String::from_utf8(run.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, (name, got)) in fields.iter().enumerate() {
            assert_eq!(
                lines[i].parse::<usize>().unwrap(),
                *got,
                "{name}: C says {}, the Rust mirror {got}",
                lines[i]
            );
        }
        let api: u32 = lines[fields.len()].parse().unwrap();
        assert_eq!(api >> 16, ffi::HWLOC_API_VERSION >> 16, "header is not hwloc 2.x");
        assert_eq!(
            lines[fields.len() + 1],
            format!(
                "{} {} {}",
                ffi::HWLOC_OBJ_PACKAGE,
                ffi::HWLOC_OBJ_PCI_DEVICE,
                ffi::HWLOC_TYPE_FILTER_KEEP_ALL
            )
        );
    }

    /// `0-3,8,10-11` (sysfs cpulist) -> ids.
    fn parse_cpulist(s: &str) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        for part in s.trim().split(',').filter(|p| !p.is_empty()) {
            match part.split_once('-') {
                Some((a, b)) => out.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
                None => {
                    out.insert(part.parse().unwrap());
                }
            }
        }
        out
    }

    /// hwloc's answer for every PCI device of this machine equals the kernel's
    /// `local_cpulist` (within the PUs hwloc sees), and its NUMA node is the kernel's.
    #[test]
    fn locality_of_every_pci_device_matches_sysfs() {
        let Ok(entries) = std::fs::read_dir("/sys/bus/pci/devices") else {
            eprintln!("skipped: no /sys/bus/pci/devices");
            return;
        };
        let hw = Hwloc::load().unwrap();
        // Depth 0 always holds the root (Machine) object.
        let root = hw.level(0)[0];
        let machine_pus: BTreeSet<u32> = Hwloc::bitmap_ids(root.cpuset).unwrap().into_iter().collect();
        assert!(!machine_pus.is_empty());
        let mut checked = 0;
        for e in entries {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let id = parse_pci_bus_id(&name).unwrap();
            assert_eq!(id.to_string(), name, "sysfs names are canonical");
            let place = pci_locality(&id).unwrap_or_else(|err| panic!("{name}: {err:#}"));
            let sysfs = std::fs::read_to_string(e.path().join("local_cpulist")).unwrap();
            let want: Vec<u32> = parse_cpulist(&sysfs).intersection(&machine_pus).copied().collect();
            assert_eq!(place.pus, want, "{name}: hwloc vs sysfs local_cpulist {sysfs:?}");
            assert_eq!(place.bus_id, name);
            assert!(!place.packages.is_empty(), "{name}: no package");
            let numa: i64 = std::fs::read_to_string(e.path().join("numa_node"))
                .map(|s| s.trim().parse().unwrap())
                .unwrap_or(-1);
            if numa >= 0 {
                assert!(
                    place.numa_nodes.contains(&(numa as usize)),
                    "{name}: sysfs numa_node {numa}, hwloc {:?}",
                    place.numa_nodes
                );
            }
            checked += 1;
        }
        eprintln!("checked {checked} PCI device(s) against sysfs");
    }

    #[test]
    fn unknown_bus_id_is_a_clear_error() {
        let id = parse_pci_bus_id("0000:ff:1f.7").unwrap();
        let e = format!("{:#}", pci_locality(&id).unwrap_err());
        assert!(e.contains("0000:ff:1f.7"), "{e}");
        assert!(
            e.contains("not found in hwloc's PCI tree") || e.contains("sees no PCI devices"),
            "{e}"
        );
        let wide = parse_pci_bus_id("10000:3b:00.0").unwrap();
        let e = format!("{:#}", pci_locality(&wide).unwrap_err());
        assert!(e.contains("10000:3b:00.0") && e.contains("16-bit"), "{e}");
    }

    #[test]
    fn topology_loads_and_drops_repeatedly() {
        // Each load destroys its topology on drop; a double free or leak of the
        // handle would crash or grow here.
        for _ in 0..20 {
            let hw = Hwloc::load().unwrap();
            assert!(!hw.level(0).is_empty());
        }
    }
}
