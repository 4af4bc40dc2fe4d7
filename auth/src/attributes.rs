//! What a request asks to do, in authorization terms: k8s.io/apiserver's
//! `authorizer.Attributes` without the user. The server's request model builds them from the
//! method, path and query (as `RequestInfoFactory` does); the [`crate::authz::Authorizer`]
//! reviews them.

use std::borrow::Cow;

/// What a request asks to do, as k8s.io/apiserver's `authorizer.Attributes` without the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    path: String,
    verb: Cow<'static, str>,
    resource: Option<ResourceAttributes>,
}

/// The resource part of [`Attributes`], for requests under `/api` or `/apis`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceAttributes {
    /// API group; empty for the core group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Resource (plural); may be empty for malformed paths such as `/apis/{g}/{v}/watch`.
    pub resource: String,
    /// Subresource (`changelog`), when the path names one.
    pub subresource: Option<String>,
    /// Namespace, for a namespaced request.
    pub namespace: Option<String>,
    /// Object name, for a request on one object.
    pub name: Option<String>,
}

impl Attributes {
    /// A resource request (under `/api` or `/apis`) on `resource`, with `verb`.
    pub fn resource_request(
        path: String,
        verb: Cow<'static, str>,
        resource: ResourceAttributes,
    ) -> Self {
        Self {
            path,
            verb,
            resource: Some(resource),
        }
    }

    /// A non-resource request (discovery, `/metrics`, `/openapi/v2`, ...): `verb` is the
    /// lower-case HTTP method.
    pub fn non_resource_request(path: String, verb: Cow<'static, str>) -> Self {
        Self {
            path,
            verb,
            resource: None,
        }
    }

    /// The verb: `get`, `list`, `watch`, `create`, ... for resource requests, the lower-case
    /// HTTP method for others.
    pub fn verb(&self) -> &str {
        &self.verb
    }

    /// The request path, percent-decoded.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The resource attributes; `None` for a non-resource request.
    pub fn resource(&self) -> Option<&ResourceAttributes> {
        self.resource.as_ref()
    }

    /// The same request on another object of the same resource: the attributes a request
    /// that names `name` instead would have (for `from=`, which reads a second object).
    /// `None` for a request that names no object.
    pub fn with_name(&self, name: &str) -> Option<Self> {
        let resource = self.resource.as_ref()?;
        self.with_object(&resource.resource, resource.subresource.as_deref(), name)
    }

    /// The same verb on another object of the same group, version and namespace: the
    /// attributes of a request on `resource`/`name`/`subresource` (for a parameter that names
    /// an object of another resource, such as a machine changelog's `to=`, a
    /// ManagedOSVersion). `None` for a request that names no object.
    pub fn with_object(
        &self,
        resource: &str,
        subresource: Option<&str>,
        name: &str,
    ) -> Option<Self> {
        let this = self.resource.as_ref()?;
        this.name.as_ref()?;
        let other = ResourceAttributes {
            group: this.group.clone(),
            version: this.version.clone(),
            resource: resource.to_owned(),
            subresource: subresource.map(str::to_owned),
            namespace: this.namespace.clone(),
            name: Some(name.to_owned()),
        };
        Some(Self {
            path: other.path(),
            verb: self.verb.clone(),
            resource: Some(other),
        })
    }

    /// Total length of the attributes, as k8s.io/apiserver's `shouldCache` counts it.
    pub fn size(&self) -> usize {
        let resource = self.resource.as_ref().map_or(0, |r| {
            r.group.len()
                + r.version.len()
                + r.resource.len()
                + r.subresource.as_ref().map_or(0, String::len)
                + r.namespace.as_ref().map_or(0, String::len)
                + r.name.as_ref().map_or(0, String::len)
        });
        self.path.len() + self.verb.len() + resource
    }
}

impl ResourceAttributes {
    /// The canonical path of these attributes: `/api/{v}` or `/apis/{g}/{v}`, then
    /// `namespaces/{ns}`, resource, name and subresource as present.
    fn path(&self) -> String {
        let mut path = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        if let Some(namespace) = &self.namespace {
            path.push_str("/namespaces/");
            path.push_str(namespace);
        }
        for part in [
            Some(&self.resource),
            self.name.as_ref(),
            self.subresource.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            path.push('/');
            path.push_str(part);
        }
        path
    }
}
