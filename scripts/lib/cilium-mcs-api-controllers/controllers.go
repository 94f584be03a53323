// Package controllers stands in for sigs.k8s.io/mcs-api/controllers v0.5.2,
// which the Go module proxy does not serve at any version. cilium-operator
// v1.20.2 uses only this constant of it; scripts/k8s-binaries (`peers`)
// replaces the module with this directory, and the build fails if the operator
// ever needs more of it.
package controllers

// DerivedServiceAnnotation is set on a ServiceImport to name its derived Service.
const DerivedServiceAnnotation = "multicluster.kubernetes.io/derived-service"
