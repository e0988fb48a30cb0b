from django.contrib.auth import views as auth_views
from django.urls import path

from frontend import views

urlpatterns = [
    path("", views.jobs_page, name="portal-jobs"),
    path("jobs/<int:job_id>", views.job_page, name="portal-job"),
    path("submit/", views.submit_page, name="portal-submit"),
    path("tokens/", views.tokens_page, name="portal-tokens"),
    path("console/", views.console_cluster, name="console-cluster"),
    path("console/queue/", views.console_queue, name="console-queue"),
    path("console/tenants/", views.console_tenants, name="console-tenants"),
    path("console/prices/", views.console_prices, name="console-prices"),
    path("billing/", views.billing_page, name="portal-billing"),
    path("billing/invoices/<int:invoice_id>", views.invoice_page, name="portal-invoice"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
]
