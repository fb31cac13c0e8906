//! report.md's sections in their order: the one list that report.md walks, and that
//! report.html walks for every section its page does not place at its top itself. A
//! new section is a variant here and its renderer; the compiler then asks for its
//! markdown and for its place on the page ([`Section::html_place`]).

use super::{communication, compute_comm_grid, decision, efficiency, nodes, noise, peer, speedup, target, times, Duplicate, Report};
use std::fmt::Write;

/// One section of report.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Section {
    /// Per workload: the verdict in a line, what to run, the next command.
    Decision,
    /// What the figures are: ddpbench's runs beside the PyTorch DDP twins, when any.
    WhatTheFiguresAre,
    Runs,
    PerWorkload,
    ComputeVsComm,
    ComputeCommGrid,
    Bandwidth,
    EpochTimes,
    Times,
    Waterfall,
    NoiseScale,
    TargetLoss,
    NodeTypes,
    Stalls,
    Incomplete,
    Duplicates,
}

/// Where report.html shows a section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HtmlPlace {
    /// At the page's top, under its own heading and beside its figures.
    Lead,
    /// In the page's "Tables" part, as report.md has it.
    Tables,
}

impl Section {
    /// report.md's order.
    pub(super) const ALL: [Section; 16] = [
        Section::Decision,
        Section::WhatTheFiguresAre,
        Section::Runs,
        Section::PerWorkload,
        Section::ComputeVsComm,
        Section::ComputeCommGrid,
        Section::Bandwidth,
        Section::EpochTimes,
        Section::Times,
        Section::Waterfall,
        Section::NoiseScale,
        Section::TargetLoss,
        Section::NodeTypes,
        Section::Stalls,
        Section::Incomplete,
        Section::Duplicates,
    ];

    /// Appends the section's markdown (nothing when the report has nothing for it).
    pub(super) fn markdown(self, md: &mut String, report: &Report) {
        let f = &report.findings;
        match self {
            Section::Decision => decision::markdown(md, &report.decisions),
            Section::WhatTheFiguresAre => peer::what_the_figures_are(md, report),
            Section::Runs => speedup::runs_table(md, &report.runs, &report.summary),
            Section::PerWorkload => speedup::per_workload(md, &report.scaling, &report.workloads),
            Section::ComputeVsComm => communication::compute_vs_comm(md, &report.runs, &f.compute_vs_comm),
            Section::ComputeCommGrid => compute_comm_grid::markdown(md, &report.runs),
            Section::Bandwidth => communication::bandwidth(md, &report.runs, &report.summary, &f.bandwidth),
            Section::EpochTimes => efficiency::epoch_times(md, &report.runs),
            Section::Times => times::markdown(md, &report.runs),
            Section::Waterfall => efficiency::waterfall(md, &report.scaling, &f.waterfall),
            Section::NoiseScale => noise::section(md, &report.runs, &report.time_to_accuracy, &report.time_to_accuracy_none),
            Section::TargetLoss => target::section(md, &report.targets),
            Section::NodeTypes => nodes::node_types(md, &report.summary, &f.node_types),
            Section::Stalls => nodes::stalls(md, &report.runs),
            Section::Incomplete => nodes::incomplete(md, &report.incomplete),
            Section::Duplicates => duplicates(md, &report.duplicates),
        }
    }

    /// Where report.html shows it.
    pub(super) fn html_place(self) -> HtmlPlace {
        match self {
            Section::Decision | Section::PerWorkload | Section::Waterfall => HtmlPlace::Lead,
            Section::WhatTheFiguresAre
            | Section::Runs
            | Section::ComputeVsComm
            | Section::ComputeCommGrid
            | Section::Bandwidth
            | Section::EpochTimes
            | Section::Times
            | Section::NoiseScale
            | Section::TargetLoss
            | Section::NodeTypes
            | Section::Stalls
            | Section::Incomplete
            | Section::Duplicates => HtmlPlace::Tables,
        }
    }
}

/// The folders that held a run counted from another folder, and which one was kept.
fn duplicates(md: &mut String, duplicates: &[Duplicate]) {
    if duplicates.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Runs reached twice (counted once)\n\n| folder | is | kept |\n|---|---|---|"
    );
    for d in duplicates {
        let _ = writeln!(
            md,
            "| `{}` | {} | `{}` |",
            d.dir.display(),
            d.why.replace('|', "/"),
            d.kept.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::{html, markdown, Findings};
    use super::*;

    /// Every heading of report.md stands on report.html, as the page renders it: here
    /// for a report with a noise scale and runs trained to a target loss, whose sections
    /// the page once left out.
    #[test]
    fn report_html_has_every_section_of_report_md() {
        use super::super::target::tests::run;
        let runs = vec![
            run("64a", 64, "a", Some(15_000), 0.5),
            run("64b", 64, "a", Some(16_000), 0.25),
            run("256a", 256, "a", Some(30_000), 0.5),
            run("256b", 256, "a", Some(33_000), 0.5),
        ];
        let report = Report {
            report_version: 0,
            schema_version: 0,
            folders: Vec::new(),
            targets: target::rows(&runs),
            runs,
            summary: Vec::new(),
            ranks: Vec::new(),
            scaling: Vec::new(),
            workloads: Vec::new(),
            decisions: Vec::new(),
            findings: Findings::default(),
            time_to_accuracy: Vec::new(),
            time_to_accuracy_none: Vec::new(),
            projection: None,
            incomplete: Vec::new(),
            skipped: Vec::new(),
            duplicates: Vec::new(),
        };
        let md = markdown::markdown(&report, false);
        let page = html::page(&report, &[], false, &html::PageLimits::default()).html;
        let headings: Vec<&str> = md.lines().filter(|l| l.starts_with("## ")).collect();
        for want in [
            "## Gradient noise scale and time to accuracy",
            "## Samples to a target: measured against predicted",
        ] {
            assert!(headings.contains(&want), "report.md lacks {want}: {headings:?}");
        }
        for h in &headings {
            // A section the page leads with has the page's own heading level.
            let rendered = html::markdown_html(h);
            let lead = rendered.trim().replace("h3>", "h2>");
            assert!(
                page.contains(rendered.trim()) || page.contains(&lead),
                "report.html lacks {h} ({})",
                rendered.trim()
            );
        }
        // The sections' own text, not only their headings: the PyTorch DDP paragraph and
        // the target table's first row.
        assert!(page.contains("These figures are the scaling of ddpbench"), "{page}");
        assert!(
            page.contains("<td>mnist-cnn</td><td>fashion-mnist</td><td>training loss 0.6</td><td>64</td>"),
            "{page}"
        );
    }
}
