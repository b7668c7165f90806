//! Examples live beside this crate (`examples/*.rs`). The book's Rust snippets are compiled
//! here as doc tests, so the guide cannot drift from the API.

/// The API guide's snippets.
#[cfg(doctest)]
#[doc = include_str!("../../book/src/api.md")]
pub struct BookApiGuide;

/// The bulk-transfer chapter's snippets.
#[cfg(doctest)]
#[doc = include_str!("../../book/src/bulk.md")]
pub struct BookBulk;

/// The quick start's snippets.
#[cfg(doctest)]
#[doc = include_str!("../../book/src/quick-start.md")]
pub struct BookQuickStart;

/// The concepts chapter's snippets.
#[cfg(doctest)]
#[doc = include_str!("../../book/src/concepts.md")]
pub struct BookConcepts;

/// The deployment chapter's snippets.
#[cfg(doctest)]
#[doc = include_str!("../../book/src/deployment.md")]
pub struct BookDeployment;
