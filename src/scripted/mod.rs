//! A scripted verbs device for tests.
