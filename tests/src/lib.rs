//! Helpers shared by the integration and VM test suites.
