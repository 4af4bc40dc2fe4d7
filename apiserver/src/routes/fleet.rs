//! The fleet view's answers: machines (MachineInventories) with the version they run, their
//! target and what is pending, a machine's changelog, and a ManagedOSImage's upgrade plan.
//!
//! Machines are resolved ([`crate::fleet`]) when their inputs change, by the machines'
//! projector ([`crate::projectors::machines`]), which keeps every machine's answer in a hub;
//! lists and gets copy the kept
//! answers (with `?cve=`, each machine's exposure is added from its kept answer, each channel's
//! first fix found once). What the view reads of the version side goes through
//! [`VersionSide`], a small interface: the versions, the channel data, and a ManagedOSVersion's
//! changelog, which a machine's changelog is (`managedosversions/{to}/changelog?from={current}`).
//! A ManagedOSImage's plan is resolved per request, off the async threads.

use std::{collections::BTreeMap, sync::Arc};

use elemental_changelog::package_index::PackageQuery;
use elemental_changelog_apiservice::{
    API_VERSION, Arch, IMAGE_RESOURCE, MACHINE_RESOURCE, MACHINE_SUMMARY_LIST_KIND, content,
    content::Representation,
    fleet::{
        CveState, MachineCve, MachineInventoryChangelogSummary,
        MachineInventoryChangelogSummaryList, MachineReason,
    },
    status::{CauseReason, StatusCause, StatusError},
    types::{PackagePresence, PackageState, VersionRef},
};
use elemental_changelog_hub::{Item, Reader};

use super::{
    ready::Ready,
    resources::{Answer, AnswerKey, Answering, Cost, Job, Render, VersionSide, selects_item},
};
use crate::{
    fleet::{reflect::FleetStores, wire},
    projectors::{
        Projectors,
        machines::{Inputs, Summaries, SummaryCache, image_meta},
    },
    request::{
        ChangelogParams, ListParams,
        fleet::{FleetResource, MachineChangelogParams, MachineParams},
    },
};

/// Seconds a client should wait before asking again for a channel being fetched.
const RETRY_AFTER_NOT_FETCHED: u32 = 2;

/// Answers the fleet view's requests.
pub struct FleetView {
    stores: FleetStores,
    versions: Arc<dyn VersionSide>,
    projectors: Arc<Projectors>,
    /// Pending summaries by snapshot generation, `from` and `to`, shared with the machines'
    /// projector: a snapshot never changes, so neither does a summary computed from it.
    summaries: Arc<SummaryCache>,
    /// See [`FirstFixes`].
    first_fixes: FirstFixes,
}

/// The first version of a channel's data fixing a CVE (its position in the channel's order),
/// by snapshot generation and CVE: found once per (channel data, CVE), whatever the number of
/// machines asked about.
type FirstFixes = quick_cache::sync::Cache<(u64, String), Option<usize>>;

/// First fixes kept (each a few dozen bytes).
const FIRST_FIXES_KEPT: usize = 10_000;

impl FleetView {
    /// Answers over the fleet stores and the channel data of `resources`.
    pub fn new(
        stores: FleetStores,
        versions: Arc<dyn VersionSide>,
        projectors: Arc<Projectors>,
    ) -> Self {
        Self {
            stores,
            versions,
            summaries: projectors.summaries().clone(),
            projectors,
            first_fixes: FirstFixes::new(FIRST_FIXES_KEPT),
        }
    }

    /// How `resource` is answered: cheap checks here (400, 406), the rest in the job.
    pub fn answering(
        self: &Arc<Self>,
        resource: &FleetResource,
        accept: Option<&str>,
    ) -> Result<Answering, StatusError> {
        let this = self.clone();
        match resource.clone() {
            FleetResource::Machines { namespace, params } => {
                let representation = content::negotiate(accept, params.include_object)?;
                params.fields.check_supported()?;
                let arch = self.versions.served_arch(params.arch.as_ref())?;
                let hub = self.hub(&arch)?;
                // Kept under the hub's last change: until the next one, every such list is
                // these bytes (a Rancher-style poller costs a lookup).
                let key = AnswerKey::list(
                    MACHINE_RESOURCE,
                    &arch,
                    namespace.as_deref(),
                    &params,
                    representation,
                    (hub.latest(), self.versions.data_changed()),
                );
                Ok(Answering::Render(Render {
                    cost: Cost::Heavy,
                    job: Job::Keep {
                        key,
                        render: Box::new(move || {
                            let (this, arch) = (&this, &arch);
                            let exposure = params.cve.as_deref().map(|cve| {
                                move |m: &MachineInventoryChangelogSummary| {
                                    this.exposure(m, cve, arch)
                                }
                            });
                            let package = params.package.as_ref().map(|query| {
                                move |item: &Item<MachineInventoryChangelogSummary>| {
                                    this.package(item, query, arch)
                                }
                            });
                            kept_machines(
                                &hub,
                                namespace.as_deref(),
                                &params,
                                representation,
                                exposure.as_ref().map(|f| f as &dyn Fn(&_) -> MachineCve),
                                package.as_ref().map(|f| f as &MachinePackage<'_>),
                            )
                        }),
                    },
                }))
            }
            FleetResource::Machine {
                namespace,
                name,
                params,
            } => self.machine_answering(namespace, name, params, accept),
            FleetResource::MachineChangelog {
                namespace,
                name,
                params,
            } => {
                let arch = self.versions.served_arch(params.arch.as_ref())?;
                let accept = accept.map(str::to_owned);
                Ok(run(Cost::Heavy, move || {
                    let (to, params) = this.machine_changelog(&namespace, &name, &params, &arch)?;
                    this.versions
                        .changelog(&namespace, &to, &params, accept.as_deref())
                }))
            }
            FleetResource::ImageChangelog {
                namespace,
                name,
                arch,
            } => {
                content::negotiate(accept, Default::default())?;
                let arch = self.versions.served_arch(arch.as_ref())?;
                Ok(run(Cost::Heavy, move || {
                    let plan = this.image_plan(&namespace, &name, &arch)?;
                    let body = serde_json::to_vec(&plan).map_err(|e| StatusError::internal(&e))?;
                    Ok(Answer::fresh(body, content::JSON))
                }))
            }
        }
    }

    /// How one machine is answered: from the live hub's kept answer (503 until it is
    /// resolved), with its exposure to `cve` when asked.
    fn machine_answering(
        self: &Arc<Self>,
        namespace: String,
        name: String,
        params: MachineParams,
        accept: Option<&str>,
    ) -> Result<Answering, StatusError> {
        let this = self.clone();
        let representation = content::negotiate(accept, params.include_object)?;
        let arch = self.versions.served_arch(params.arch.as_ref())?;
        if self.stores.machines.get(&namespace, &name).is_none() {
            return Err(StatusError::not_found(MACHINE_RESOURCE, &name));
        }
        let item = self.hub(&arch)?.get(&namespace, &name).ok_or_else(|| {
            StatusError::service_unavailable(
                format!("MachineInventory {namespace}/{name} is not resolved yet"),
                Some(RETRY_AFTER_NOT_FETCHED),
            )
        })?;
        Ok(run(Cost::Light, move || {
            let body = match (representation, &params.cve) {
                (Representation::Json, None) => item.json(),
                (_, cve) => {
                    let mut object = item.object();
                    object.cve = cve.as_deref().map(|c| this.exposure(&object, c, &arch));
                    render(representation, vec![object], cve.is_some(), false)?
                }
            };
            Ok(Answer::fresh(body, representation.content_type()))
        }))
    }

    /// The machines' hub for `arch`.
    fn hub(&self, arch: &Arch) -> Result<Reader<MachineInventoryChangelogSummary>, StatusError> {
        self.projectors
            .machines(arch)
            .cloned()
            .ok_or_else(|| StatusError::bad_request(format!("arch {arch} is not served")))
    }

    /// What resolving the machines of `namespace` (or all) reads.
    fn inputs(&self, namespace: Option<&str>, arch: &Arch) -> Inputs {
        let snapshots = self.versions.snapshots(namespace, arch);
        Inputs {
            versions: self.versions.versions(namespace),
            images: self.stores.images.list(namespace),
            selectors: self.stores.selectors.list(namespace),
            channels: crate::projectors::machines::Channels { snapshots },
        }
    }

    /// The ManagedOSVersion changelog request a machine's changelog is.
    fn machine_changelog(
        &self,
        namespace: &str,
        name: &str,
        params: &MachineChangelogParams,
        arch: &Arch,
    ) -> Result<(String, ChangelogParams), StatusError> {
        let machine = self
            .stores
            .machines
            .get(namespace, name)
            .ok_or_else(|| StatusError::not_found(MACHINE_RESOURCE, name))?;
        let inputs = self.inputs(Some(namespace), arch);
        let index = inputs.index();
        let resolution = index.machine(&machine);
        let Some(current) = &resolution.current else {
            let reason = resolution
                .reason
                .unwrap_or(MachineReason::VersionInNoChannel);
            let message = format!(
                "the version MachineInventory {namespace}/{name} runs is not known: {}",
                resolution.message.as_deref().unwrap_or("not resolved")
            );
            return Err(with_cause(
                StatusError::not_found(MACHINE_RESOURCE, name),
                message,
                reason,
            ));
        };
        let to = match (&params.to, &resolution.target) {
            (Some(to), _) => to.clone(),
            (None, Some(target)) if target.channel == current.channel => target.name.clone(),
            (None, Some(target)) => {
                return Err(with_cause(
                    StatusError::not_found(MACHINE_RESOURCE, name),
                    format!(
                        "the target of MachineInventory {namespace}/{name} ({}) is in channel {}, not in channel {} of the version it runs ({}): there is no changelog between them; name a version of channel {} with ?to=",
                        target.name, target.channel, current.channel, current.name, current.channel
                    ),
                    MachineReason::OtherChannel,
                ));
            }
            (None, None) => {
                let mut error = StatusError::service_unavailable(
                    format!(
                        "the target of MachineInventory {namespace}/{name} is not known yet: {}",
                        resolution
                            .message
                            .as_deref()
                            .unwrap_or("channel data not fetched")
                    ),
                    Some(RETRY_AFTER_NOT_FETCHED),
                );
                let message = error.message.clone();
                error = with_cause(error, message, MachineReason::ChannelNotFetched);
                return Err(error);
            }
        };
        if let Some(version) = self.versions.version(namespace, &to)
            && version.channel_name() != Some(current.channel.as_str())
        {
            return Err(StatusError::bad_request(format!(
                "to: ManagedOSVersion {to} is not in channel {} of the version MachineInventory {name} runs ({})",
                current.channel, current.name
            )));
        }
        Ok((
            to,
            ChangelogParams {
                from: Some(current.name.clone()),
                arch: Some(arch.clone()),
                format: params.format,
            },
        ))
    }

    fn image_plan(
        &self,
        namespace: &str,
        name: &str,
        arch: &Arch,
    ) -> Result<elemental_changelog_apiservice::fleet::ManagedOSImageChangelog, StatusError> {
        let image = self
            .stores
            .images
            .get(namespace, name)
            .ok_or_else(|| StatusError::not_found(IMAGE_RESOURCE, name))?;
        let machines = self.stores.machines.list(Some(namespace));
        let inputs = self.inputs(Some(namespace), arch);
        let index = inputs.index();
        let plan = index.plan(&image, machines.iter().map(AsRef::as_ref));
        let mut summaries = Summaries {
            here: BTreeMap::new(),
            kept: &self.summaries,
        };
        Ok(plan.to_object(image_meta(&image), |p| summaries.of(&inputs.channels, p)))
    }

    /// A machine's exposure to `cve`, from its kept answer (the version it runs) and its
    /// channel's data for `arch`: the channel's first version fixing the CVE is found once
    /// per channel data and CVE (`FirstFixes`), so a list or a watch of any number of
    /// machines walks each channel once.
    pub fn exposure(
        &self,
        machine: &MachineInventoryChangelogSummary,
        cve: &str,
        arch: &Arch,
    ) -> MachineCve {
        let unknown = MachineCve {
            id: cve.to_owned(),
            state: CveState::Unknown,
            fixed_in: None,
        };
        let Some(current) = &machine.current else {
            return unknown;
        };
        let namespace = machine.metadata.namespace.as_str();
        let Some(snapshot) = self.versions.snapshot(namespace, &current.channel, arch) else {
            return unknown;
        };
        let order = snapshot.data.order();
        let Some(position) = order.iter().position(|n| *n == current.name) else {
            return unknown;
        };
        let first = self
            .first_fixes
            .get_or_insert_with(&(snapshot.generation().get(), cve.to_owned()), || {
                Ok::<_, std::convert::Infallible>(
                    order
                        .iter()
                        .position(|name| snapshot.data.fixes_cve(name, cve)),
                )
            })
            .unwrap_or_else(|never| match never {});
        let Some(first) = first else {
            return MachineCve {
                id: cve.to_owned(),
                state: CveState::NoFixInChannel,
                fixed_in: None,
            };
        };
        let name = order[first].clone();
        let version = self
            .versions
            .version(namespace, &name)
            .map_or_else(|| name.clone(), |v| v.spec.version.clone());
        MachineCve {
            id: cve.to_owned(),
            state: if first <= position {
                CveState::Fixed
            } else {
                CveState::Exposed
            },
            fixed_in: Some(VersionRef { name, version }),
        }
    }

    /// The `package` block of a kept machine answer: what the version it runs carries of
    /// the package `query` names, in its channel's data for `arch` (`Unknown`, with the
    /// machine's reason, when its version is unknown); `None` when `query`'s bounds leave the
    /// machine out. Only the machine's resolution is read of its answer, and the package
    /// comes from its version's entry of the channel's package index: nothing per machine.
    pub fn package(
        &self,
        item: &Item<MachineInventoryChangelogSummary>,
        query: &PackageQuery,
        arch: &Arch,
    ) -> Option<PackagePresence> {
        let resolved: Resolved = serde_json::from_slice(&item.json()).ok()?;
        self.package_of(item.namespace(), resolved, query, arch)
    }

    /// [`FleetView::package`] of a machine answer already parsed (a watch event's).
    pub fn machine_package(
        &self,
        machine: &MachineInventoryChangelogSummary,
        query: &PackageQuery,
        arch: &Arch,
    ) -> Option<PackagePresence> {
        let resolved = Resolved {
            current: machine.current.clone(),
            reason: machine.reason,
            message: machine.message.clone(),
        };
        self.package_of(&machine.metadata.namespace, resolved, query, arch)
    }

    fn package_of(
        &self,
        namespace: &str,
        resolved: Resolved,
        query: &PackageQuery,
        arch: &Arch,
    ) -> Option<PackagePresence> {
        let Some(current) = resolved.current else {
            if query.is_bounded() {
                return None;
            }
            let mut block = PackagePresence::without(query.name(), PackageState::Unknown);
            block.message = Some(match (resolved.reason, resolved.message) {
                (Some(reason), Some(message)) => format!("{}: {message}", wire(&reason)),
                (Some(reason), None) => wire(&reason),
                (None, message) => message.unwrap_or_else(|| "not resolved".to_owned()),
            });
            return Some(block);
        };
        let snapshot = self.versions.snapshot(namespace, &current.channel, arch);
        crate::objects::package(
            snapshot.as_ref().map(|s| s.data.as_ref()),
            &current.name,
            query,
        )
    }
}

/// What [`FleetView::package`] reads of a machine's answer: its resolution.
#[derive(serde::Deserialize)]
struct Resolved {
    current: Option<elemental_changelog_apiservice::fleet::ChannelVersion>,
    reason: Option<MachineReason>,
    message: Option<String>,
}

/// What `?package=` adds to a kept machine answer: its `package` block, or `None` when the
/// bounds leave the machine out.
type MachinePackage<'a> =
    dyn Fn(&Item<MachineInventoryChangelogSummary>) -> Option<PackagePresence> + 'a;

/// The kept machines of `namespace` (or all) that `params` select, as a list with the
/// resourceVersion a watch may start from, ready to keep; with `exposure`, each with its
/// exposure to the CVE asked; with `package`, each with its `package` block, only those its
/// bounds keep. Written item by item (a Table row by row), compressed as it is written when
/// large: no uncompressed copy of a large list is held.
fn kept_machines(
    hub: &Reader<MachineInventoryChangelogSummary>,
    namespace: Option<&str>,
    params: &ListParams,
    representation: Representation,
    exposure: Option<&dyn Fn(&MachineInventoryChangelogSummary) -> MachineCve>,
    package: Option<&MachinePackage<'_>>,
) -> Result<Ready, StatusError> {
    let list = hub.list(namespace);
    let version = list.version;
    let selected: Vec<_> = list
        .iter()
        .filter(|i| selects_item(params, i) && package.is_none_or(|f| f(i).is_some()))
        .collect();
    let with_cve = |item: &Item<MachineInventoryChangelogSummary>| {
        let mut object = item.object();
        object.cve = exposure.map(|f| f(&object));
        object.package = package.and_then(|f| f(item));
        object
    };
    let size = super::list::kept_bytes(&selected);
    let content_type = representation.content_type();
    let written = match representation {
        Representation::Json => Ready::written(size, content_type, |out| {
            let each = |item: &Item<_>| match (exposure, package) {
                (None, Some(package)) => with_package(item, package),
                _ => serde_json::to_vec(&with_cve(item)).unwrap_or_default(),
            };
            super::list::write_list(
                out,
                API_VERSION,
                MACHINE_SUMMARY_LIST_KIND,
                version,
                &selected,
                (exposure.is_some() || package.is_some())
                    .then_some(&each as &dyn Fn(&Item<_>) -> Vec<u8>),
            )
        }),
        Representation::Table {
            version: table_version,
            include_object,
        } => Ready::written(size, content_type, |out| {
            let cve = exposure.is_some();
            let mut head = elemental_changelog_apiservice::fleet::table::machines_table(
                &[],
                true,
                cve,
                table_version,
                include_object,
            );
            if package.is_some() {
                elemental_changelog_apiservice::table::add_package_column(&mut head, []);
            }
            head.metadata.resource_version = version.text();
            let head = serde_json::to_vec(&head)?;
            // `{..,"rows":[]}`: the rows go between the brackets.
            let open = head.len().saturating_sub(2);
            out.write_all(&head[..open])?;
            for (i, item) in selected.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                let object = with_cve(item);
                let mut row = elemental_changelog_apiservice::fleet::table::row(
                    &object,
                    true,
                    cve,
                    table_version,
                    include_object,
                );
                if package.is_some() {
                    row.cells
                        .push(elemental_changelog_apiservice::table::package_cell(
                            object.package.as_ref(),
                        ));
                }
                serde_json::to_writer(&mut *out, &row)?;
            }
            out.write_all(&head[open..])
        }),
    };
    written.map_err(|e| StatusError::internal(&e))
}

/// A kept machine answer with its `package` block: its JSON with the block added as its last
/// field, as serializing the machine with it would write it (`package` is the last field), so
/// the answer is not parsed and written again.
fn with_package(
    item: &Item<MachineInventoryChangelogSummary>,
    package: &MachinePackage<'_>,
) -> Vec<u8> {
    let mut json = item.json();
    let block = package(item);
    let written = block.as_ref().and_then(|b| serde_json::to_vec(b).ok());
    let (Some(written), Some(b'}')) = (written, json.last()) else {
        let mut object = item.object();
        object.package = block;
        return serde_json::to_vec(&object).unwrap_or_default();
    };
    json.pop();
    json.extend_from_slice(b",\"package\":");
    json.extend_from_slice(&written);
    json.push(b'}');
    json
}

/// A job run off the async threads whose answer is made for this request.
fn run(
    cost: Cost,
    job: impl FnOnce() -> Result<Answer, StatusError> + Send + 'static,
) -> Answering {
    Answering::Render(Render {
        cost,
        job: Job::Run(Box::new(job)),
    })
}

/// Machine summaries as JSON (one, or a list) or a Table.
fn render(
    representation: Representation,
    items: Vec<MachineInventoryChangelogSummary>,
    cve: bool,
    list: bool,
) -> Result<Vec<u8>, StatusError> {
    match representation {
        Representation::Table {
            version,
            include_object,
        } => serde_json::to_vec(
            &elemental_changelog_apiservice::fleet::table::machines_table(
                &items,
                true,
                cve,
                version,
                include_object,
            ),
        )
        .map_err(|e| StatusError::internal(&e)),
        Representation::Json => json(items, list),
    }
}

/// Machine summaries as JSON: a list, or the one machine.
fn json(items: Vec<MachineInventoryChangelogSummary>, list: bool) -> Result<Vec<u8>, StatusError> {
    if list {
        serde_json::to_vec(&MachineInventoryChangelogSummaryList::new(items))
    } else {
        serde_json::to_vec(&items.into_iter().next().unwrap_or_default())
    }
    .map_err(|e| StatusError::internal(&e))
}

/// A 4xx/5xx with a cause naming the machine reason.
fn with_cause(mut error: StatusError, message: String, reason: MachineReason) -> StatusError {
    error.message = message.clone();
    let details = error.details.get_or_insert_with(Box::default);
    details.causes.push(StatusCause {
        reason: CauseReason::from(wire(&reason).as_str()),
        message,
        field: String::new(),
    });
    error
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{fleet::crd::MachineInventory, projectors::machines::machine_meta};
    use elemental_changelog_apiservice::fleet::MachineState;

    #[test]
    fn an_answer_shows_the_labels_the_machine_keeps() {
        let mut m: MachineInventory = serde_json::from_value(serde_json::json!({
            "apiVersion": "elemental.cattle.io/v1beta1", "kind": "MachineInventory",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u", "resourceVersion": "3",
                "labels": {"zone": "b", "machineUUID": "6f1c", "a/b": ""}},
            "spec": {}
        }))
        .unwrap();
        let labels = m.metadata.labels.clone().unwrap();
        crate::fleet::reflect::trim_machine(&mut m);
        let meta = machine_meta(&m);
        assert_eq!(meta.labels, labels);
        // A uid of its own, derived from the MachineInventory's.
        let uid = elemental_changelog_apiservice::identity::uid(
            elemental_changelog_apiservice::MACHINE_RESOURCE,
            "u",
        );
        assert_eq!(
            (meta.name.as_str(), meta.uid.as_deref()),
            ("m", Some(uid.as_str()))
        );
        assert_eq!(
            serde_json::to_string(&meta.labels).unwrap(),
            r#"{"a/b":"","machineUUID":"6f1c","zone":"b"}"#
        );
    }

    #[test]
    fn unused_state_names_are_wire_names() {
        assert_eq!(wire(&MachineState::UpdatesAvailable), "UpdatesAvailable");
        assert_eq!(wire(&MachineReason::OtherChannel), "OtherChannel");
    }
}
