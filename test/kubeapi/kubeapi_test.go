package kubeapi_test

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/egret-proxy/egret/internal/testkit/testenv"
	"github.com/egret-proxy/egret/test/kubeapi"
)

func TestClusterStoresPodsAndGoesAway(t *testing.T) {
	var pids []int
	var dir string
	t.Run("cluster", func(t *testing.T) {
		c := kubeapi.Start(t)
		pids, dir = c.PIDs(), c.Dir
		if len(pids) != 2 {
			t.Fatalf("pids %v", pids)
		}
		ctx := context.Background()
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil || string(body) != "ok" {
			t.Fatalf("/readyz: %q %v", body, err)
		}
		v, err := c.Client.Discovery().ServerVersion()
		if err != nil {
			t.Fatal(err)
		}
		if v.GitVersion != "v1.36.3" {
			t.Errorf("server version %q, want the tools module's v1.36.3", v.GitVersion)
		}

		ns := c.Namespace(t)
		pods := c.Client.CoreV1().Pods(ns)
		pod, err := pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "example.invalid/web"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Status.Phase != corev1.PodPending {
			t.Errorf("new pod phase %q, want Pending", pod.Status.Phase)
		}
		// No kubelet: the test says the pod runs.
		pod.Status.Phase = corev1.PodRunning
		if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		sel, err := pods.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-a"})
		if err != nil || len(sel.Items) != 1 || sel.Items[0].Status.Phase != corev1.PodRunning {
			t.Fatalf("pods on node-a: %+v %v", sel, err)
		}
		if other, err := pods.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-b"}); err != nil || len(other.Items) != 0 {
			t.Fatalf("pods on node-b: %+v %v", other, err)
		}

		// The kubeconfig file reaches the same server.
		kc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := kubernetes.NewForConfig(kc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{}); err != nil {
			t.Fatalf("through the kubeconfig: %v", err)
		}

		// Without a kubelet a graceful delete only marks the pod.
		if err := pods.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := pods.Get(ctx, "web", metav1.GetOptions{})
		if err != nil || got.DeletionTimestamp == nil {
			t.Fatalf("after a graceful delete: %v %v", got.DeletionTimestamp, err)
		}
		zero := int64(0)
		if err := pods.Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		if _, err := pods.Get(ctx, "web", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("after delete with grace 0: %v", err)
		}
	})
	// The subtest's cleanup stopped the processes and removed the files.
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still there after the test (%v)", pid, err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there (%v)", dir, err)
	}
}

func TestRBACHoldsImpersonatedUsersToTheirRoles(t *testing.T) {
	c := kubeapi.StartWith(t, kubeapi.Options{RBAC: true})
	ctx := context.Background()
	ns := c.Namespace(t)
	const user = "system:serviceaccount:egret:egret"
	as, err := kubernetes.NewForConfig(c.ConfigAs(user, "system:serviceaccounts"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := as.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list pods without a role: %v, want Forbidden", err)
	}
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "pod-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "egret", Name: "egret"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The authorizer learns of the binding through its informers.
	// Polls: the authorizer's cache takes the new binding with no event.
	var listErr error
	testenv.Poll(10*time.Second, func() bool {
		_, listErr = as.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if listErr != nil && !apierrors.IsForbidden(listErr) {
			t.Fatalf("list pods with the role: %v", listErr)
		}
		return listErr == nil
	})
	if listErr != nil {
		t.Fatalf("list pods with the role: %v", listErr)
	}
	// The role does not reach further than it says.
	if _, err := as.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list secrets with a pod role: %v, want Forbidden", err)
	}
	// A kubeconfig file for the same user is held to the same role.
	kc, err := clientcmd.BuildConfigFromFlags("", c.KubeconfigAs(t, user, "system:serviceaccounts"))
	if err != nil {
		t.Fatal(err)
	}
	viaFile, err := kubernetes.NewForConfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := viaFile.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("list pods through KubeconfigAs: %v", err)
	}
	if _, err := viaFile.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list secrets through KubeconfigAs: %v, want Forbidden", err)
	}
}
